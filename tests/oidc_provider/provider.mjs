// A certified OpenID Provider (oidc-provider) for the gateway's sign-in tests, configured from a JSON file:
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"port": 0-65535, "client": {"client_id", "client_secret", "redirect_uris": [...]},
//          "accounts": {"<login>": {"sub": "...", "email": "...", "groups": [...], ...}},
//          "userinfo_sub": {"<login>": "<another sub>"}}   (optional: a provider whose userinfo names someone else)
//
// Each account's claims are what the provider knows of the person; which of them reach the ID token and which
// only the userinfo endpoint is oidc-provider's decision (conformIdTokenClaims: with an access token issued,
// scope-requested claims such as email, preferred_username and groups are in userinfo only). The development
// interactions are on: a test signs in by posting the login form (any password) and the consent form.
// Prints one line, "ready ISSUER", once it listens; stops on SIGTERM.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const userinfoSub = config.userinfo_sub || {};

const provider = new Provider(issuer, {
  clients: [{
    ...config.client,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  conformIdTokenClaims: true,
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true } },
  cookies: { keys: ['gateway-tests-only-cookie-key'] },
  async findAccount(ctx, login) {
    const person = config.accounts[login];
    if (!person) return undefined;
    return {
      accountId: login,
      async claims(use) {
        const sub = use === 'userinfo' && userinfoSub[login] ? userinfoSub[login] : person.sub;
        return { ...person, sub };
      },
    };
  },
});

// the development interactions sign in whoever's login is typed; an unknown login would fail later, unclearly
provider.on('server_error', (ctx, error) => { process.stderr.write(`server_error: ${error.stack}\n`); });

const server = provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`ready ${issuer}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
