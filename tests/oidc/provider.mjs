// A real OpenID Connect provider for the console's sign-in tests: oidc-provider (pinned in
// package.json), on loopback, with its own development login and consent pages. Its
// configuration is one JSON argument: {port, clients, accounts: {login: claims}, ttl_s,
// claims: {scope: [claim names]}, kid} (the claims each scope puts in the ID token, by
// default {callgate: ["tenant", "roles"]}; the signing key's id, distinct per provider).
// It prints "ready <issuer>" once it listens, and stops on SIGTERM.
import { generateKeyPairSync } from "node:crypto";
import Provider from "oidc-provider";

const conf = JSON.parse(process.argv[2]);
const issuer = `http://127.0.0.1:${conf.port}`;
const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const scoped = conf.claims ?? { callgate: ["tenant", "roles"] };
const jwk = { ...privateKey.export({ format: "jwk" }), kid: conf.kid ?? "idp-rs256-1", use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
  clients: conf.clients,
  jwks: { keys: [jwk] },
  pkce: { required: () => true },
  // The claims of a scope go into the ID token itself (callgate reads the ID token only).
  conformIdTokenClaims: false,
  claims: { openid: ["sub"], ...scoped },
  scopes: ["openid", ...Object.keys(scoped)],
  ttl: { IdToken: conf.ttl_s ?? 3600, AccessToken: conf.ttl_s ?? 3600 },
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const claims = conf.accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
});
provider.proxy = false;
const server = provider.listen(conf.port, "127.0.0.1", () => console.log(`ready ${issuer}`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
