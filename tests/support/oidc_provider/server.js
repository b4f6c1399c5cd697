// A real OpenID provider for opod's sign-in tests: panva's oidc-provider on one loopback port.
//
//   node server.js --port 4000 --redirect-uri http://127.0.0.1:8080/auth/oidc/callback \
//        [--client-id opod] [--client-secret s3cret] [--claim-issuer URL]
//
// Its issuer is http://127.0.0.1:PORT. One confidential client (client_secret_basic, PKCE required);
// the people below sign in at the development login form (GET /interaction/UID, then POST there
// prompt=login&login=ACCOUNT&password=anything); consent is taken as given. A fresh signing key is
// made at every start, so a restart is a key rotation. With --claim-issuer, the discovery document
// names that issuer instead of its own (a provider that claims to be another) and does not say it names
// itself in its answers: its tokens still carry its own. It prints one line "ready ISSUER" once it listens.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';

import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    'redirect-uri': { type: 'string' },
    'client-id': { type: 'string', default: 'opod' },
    'client-secret': { type: 'string', default: 'opod-test-client-secret' },
    'claim-issuer': { type: 'string', default: '' },
  },
});
if (!args.port || !args['redirect-uri']) {
  console.error('usage: node server.js --port PORT --redirect-uri URL [--client-id ID] [--client-secret S] [--claim-issuer URL]');
  process.exit(2);
}

const issuer = `http://127.0.0.1:${args.port}`;

const ACCOUNTS = {
  ada: {
    email: 'ada@example.com', email_verified: true, name: 'Ada Lovelace', groups: ['fleet-admins', 'engineering'],
  },
  bob: {
    email: 'bob@example.com', email_verified: true, name: 'Bob Builder', groups: ['engineering'],
  },
  carol: {
    email: 'carol@example.com', email_verified: true, name: 'Carol Shaw', groups: [],
  },
  mallory: {
    email: 'ada@example.com', email_verified: false, name: 'Not Ada', groups: ['fleet-admins'],
  },
};

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: randomBytes(8).toString('hex'), use: 'sig', alg: 'RS256' };

const provider = new Provider(issuer, {
  clients: [{
    client_id: args['client-id'],
    client_secret: args['client-secret'],
    redirect_uris: [args['redirect-uri']],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [signing] },
  cookies: { keys: [randomBytes(16).toString('hex')] },
  pkce: { required: () => true },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  features: { devInteractions: { enabled: true } },
  // The client is the provider's own: consent is taken as given, so a login is the only interaction.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
  async findAccount(ctx, id) {
    const account = ACCOUNTS[id];
    if (!account) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...account }; } };
  },
});

if (args['claim-issuer']) {
  const claimed = args['claim-issuer'];
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.path === '/.well-known/openid-configuration' && ctx.body) {
      // Like a provider that does not name itself in its answers (RFC 9207), so only its ID tokens say who it is.
      const { authorization_response_iss_parameter_supported: _, ...rest } = ctx.body;
      ctx.body = { ...rest, issuer: claimed };
    }
  });
}

provider.listen(Number(args.port), '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
