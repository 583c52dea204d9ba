"""The application: the use cases of callgate over explicit ports.

Agents' calls (``agent_calls``), approvals (``approvals``), reads (``queries``) and
operators' commands (``operators``) share one base (``base``) over the ports (``ports``):
the backend a client publishes to and reads from, and what the composition root gives.
``client.Gateway`` gathers them for the SDK and the surfaces; ``answers`` shapes every
answer, ``routing`` names where a request goes. Nothing here decides: the deciders do.
"""
