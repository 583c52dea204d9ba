FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY services ./services
COPY projections ./projections
COPY schemas ./services/callgate/_schemas
RUN pip install --no-cache-dir .
ENV CALLGATE_STATE_DIR=/data
VOLUME /data
ENTRYPOINT ["callgate"]
CMD ["serve"]
