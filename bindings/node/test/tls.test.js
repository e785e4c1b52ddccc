// TLS to a real redis-server whose certificates come from a private CA made
// by this test with the openssl command line: trust through `tls.ca`, mutual
// TLS through `tls.cert` and `tls.key`, and failures that stay failures (an
// untrusted server is an error, never a plain-text fallback).
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter } = require('throttlegate');
const { startRedis, freePort, makeCertificates, freshPrefix } = require('./helpers.js');

const RULES = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 10, window: '1h' }] };

/** A redis-server with a plain port (for the test's own commands) and a TLS port. */
async function startTlsRedis(certs, authClients) {
  let tlsPort;
  const server = await startRedis(async () => {
    tlsPort = await freePort();
    return [
      '--tls-port', String(tlsPort),
      '--tls-cert-file', certs.file('server.pem'),
      '--tls-key-file', certs.file('server.key'),
      '--tls-ca-cert-file', certs.file('ca.pem'),
      '--tls-auth-clients', authClients,
    ];
  });
  return { ...server, tlsUrl: `rediss://localhost:${tlsPort}` };
}

describe('TLS with a private CA', () => {
  let certs;
  let server;
  let mutual;
  before(async () => {
    certs = makeCertificates();
    server = await startTlsRedis(certs, 'no');
    mutual = await startTlsRedis(certs, 'yes');
  });
  after(async () => {
    await Promise.all([server && server.stop(), mutual && mutual.stop()]);
    if (certs) certs.remove();
  });

  it('checks through TLS when told to trust the CA (Buffer, string or array)', async () => {
    for (const ca of [certs.pem('ca.pem'), certs.pem('ca.pem').toString('utf8'), [certs.pem('server.pem'), certs.pem('ca.pem')]]) {
      const limiter = new Limiter(RULES, {
        url: server.tlsUrl,
        keyPrefix: freshPrefix('tls'),
        timeout: 5000,
        onBackendError: 'error',
        tls: { ca },
      });
      const d = await limiter.check({ ip: '192.0.2.10' });
      assert.equal(d.allowed, true);
      assert.equal(d.degraded, false);
      assert.equal(d.remaining, 9);
      // The count landed on this server (read back over its plain port).
      const [key] = limiter.keys({ ip: '192.0.2.10' });
      assert.equal(await server.command(['EXISTS', key]), ':1\r\n');
      await limiter.close();
    }
  });

  it('refuses a server it cannot verify: backend (not temporary), nothing written', async () => {
    const prefix = freshPrefix('untrusted');
    const limiter = new Limiter(RULES, { url: server.tlsUrl, keyPrefix: prefix, timeout: 5000, onBackendError: 'error' });
    await assert.rejects(limiter.check({ ip: '192.0.2.11' }), (err) => {
      assert.ok(err instanceof Error);
      assert.equal(err.code, 'backend');
      assert.match(err.message, /certificate/i);
      return true;
    });
    await assert.rejects(limiter.ping(), { code: 'backend' });
    const [key] = limiter.keys({ ip: '192.0.2.11' });
    assert.equal(await server.command(['EXISTS', key]), ':0\r\n');
    await limiter.close();

    // With the default failure mode the caller gets a degraded answer instead.
    const allow = new Limiter(RULES, { url: server.tlsUrl, keyPrefix: prefix, timeout: 5000 });
    const d = await allow.check({ ip: '192.0.2.11' });
    assert.equal(d.allowed, true);
    assert.equal(d.degraded, true);
    assert.equal(allow.stats().degradedAllowed, 1);
    await allow.close();
  });

  it('never speaks plain text to a rediss:// URL', async () => {
    // The plain port does not speak TLS: the handshake never completes.
    const url = `rediss://localhost:${server.port}`;
    const prefix = freshPrefix('plain');
    const limiter = new Limiter(RULES, { url, keyPrefix: prefix, timeout: 300, onBackendError: 'error', tls: { ca: certs.pem('ca.pem') } });
    await assert.rejects(limiter.check({ ip: '192.0.2.12' }), (err) => {
      assert.ok(['timeout', 'backend_unavailable'].includes(err.code), `${err.code}: ${err.message}`);
      return true;
    });
    const [key] = limiter.keys({ ip: '192.0.2.12' });
    assert.equal(await server.command(['EXISTS', key]), ':0\r\n');
    await limiter.close();
  });

  it('presents a client certificate to a server that requires one', async () => {
    const ca = certs.pem('ca.pem');
    const withCert = new Limiter(RULES, {
      url: mutual.tlsUrl,
      keyPrefix: freshPrefix('mtls'),
      timeout: 5000,
      onBackendError: 'error',
      tls: { ca, cert: certs.pem('client.pem'), key: certs.pem('client.key').toString('utf8') },
    });
    const d = await withCert.check({ ip: '192.0.2.13' });
    assert.equal(d.allowed, true);
    assert.equal(d.degraded, false);
    await withCert.close();

    // Trusting the server is not enough when it requires a client certificate.
    const without = new Limiter(RULES, { url: mutual.tlsUrl, timeout: 5000, onBackendError: 'error', tls: { ca } });
    // The server's refusal arrives as a TLS alert (backend) or a closed connection.
    await assert.rejects(without.check({ ip: '192.0.2.13' }), (err) => {
      assert.ok(['backend', 'backend_unavailable'].includes(err.code), `${err.code}: ${err.message}`);
      return true;
    });
    await without.close();
  });

  it('rejects malformed tls options with invalid_argument naming the field', () => {
    const ca = certs.pem('ca.pem');
    const cases = [
      [{ cert: certs.pem('client.pem') }, /options\.tls\.key: required with options\.tls\.cert/],
      [{ key: certs.pem('client.key') }, /options\.tls\.cert: required with options\.tls\.key/],
      [{ ca: 42 }, /options\.tls\.ca: expected a string or bytes, got a number/],
      [{ ca: [ca, {}] }, /options\.tls\.ca\[1\]: expected a string or bytes, got an object/],
      [{ ca, rejectUnauthorized: false }, /options\.tls: unknown option "rejectUnauthorized" \(known: ca, cert, key\)/],
      ['ca.pem', /options\.tls: expected an object of ca, cert and key, got a string/],
      [{ ca, cert: certs.pem('client.pem'), key: 'not a key' }, /private key/],
    ];
    for (const [tls, message] of cases) {
      assert.throws(() => new Limiter(RULES, { url: server.tlsUrl, tls }), (err) => {
        assert.ok(err instanceof Error);
        assert.equal(err.code, 'invalid_argument', err.message);
        assert.match(err.message, message);
        return true;
      });
    }
  });
});
