// Test support: real redis-server processes on free loopback ports (alone
// or as a Redis Cluster), loopback listeners that accept connections and
// never answer, and a private certificate authority made with openssl.
'use strict';

const { execFile, execFileSync, spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

// $THROTTLEGATE_REDIS_SERVER (or $REDIS_SERVER): another Redis-compatible server (the Valkey pass).
const REDIS_SERVER = process.env.THROTTLEGATE_REDIS_SERVER || process.env.REDIS_SERVER || 'redis-server';
const REDIS_CLI = process.env.THROTTLEGATE_REDIS_CLI || 'redis-cli';

/** A free TCP port on 127.0.0.1 (the kernel picks it). */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Whether `reply` holds a whole RESP reply (a bulk string may come in several chunks). */
function complete(reply) {
  if (!reply.endsWith('\r\n')) return false;
  if (!reply.startsWith('$')) return true;
  const header = reply.indexOf('\r\n');
  const len = Number(reply.slice(1, header));
  return len < 0 || Buffer.byteLength(reply) >= header + 2 + len + 2;
}

/** Send one RESP command and resolve with the raw reply text. */
function redisCommand(port, args) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let reply = '';
    sock.setEncoding('utf8');
    sock.once('error', reject);
    sock.on('data', (chunk) => {
      reply += chunk;
      if (complete(reply)) {
        sock.end();
        resolve(reply);
      }
    });
    let msg = `*${args.length}\r\n`;
    for (const a of args) msg += `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`;
    sock.write(msg);
  });
}

/**
 * Start a redis-server on a free port, without persistence. Resolves to
 * `{ port, url, stop() }` once it answers PING. `extraArgs` may be a function
 * of the port, for options that name other files or ports per server.
 */
async function startRedis(extraArgs = []) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const extra = typeof extraArgs === 'function' ? await extraArgs(port) : extraArgs;
    const server = await startRedisAt(port, extra);
    if (server !== null) return server;
  }
  throw new Error(`could not start ${REDIS_SERVER}`);
}

/**
 * Start a redis-server on `port` (as `startRedis` does; for a restart on the
 * port a stopped server had). Resolves to `{ port, url, pid, stop(), command() }`,
 * or `null` if it did not come up.
 */
async function startRedisAt(port, extra = []) {
  const child = spawn(
    REDIS_SERVER,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...extra],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  for (let i = 0; i < 200 && !exited; i++) {
    try {
      if ((await redisCommand(port, ['PING'])).startsWith('+PONG')) {
        const stop = () =>
          new Promise((resolve) => {
            if (exited) return resolve();
            child.once('exit', () => resolve());
            child.kill('SIGKILL');
          });
        return { port, url: `redis://127.0.0.1:${port}`, pid: child.pid, stop, command: (args) => redisCommand(port, args) };
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  child.kill('SIGKILL');
  return null;
}

/**
 * A loopback listener that accepts connections and never answers: a Redis
 * that hangs. Resolves to `{ port, url, close() }`.
 */
function startSilentServer() {
  return new Promise((resolve, reject) => {
    const sockets = new Set();
    const srv = net.createServer((s) => {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => sockets.delete(s));
    });
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      resolve({
        port,
        url: `redis://127.0.0.1:${port}`,
        close: () =>
          new Promise((r) => {
            for (const s of sockets) s.destroy();
            srv.close(() => r());
          }),
      });
    });
  });
}

/**
 * A local Redis Cluster: `primaries` primaries and one replica each, every
 * node in a temporary directory of its own (for its nodes.conf). Resolves to
 * `{ url, nodes, stop() }` once every node reports the cluster `ok` with all
 * 16384 slots served; `url` is a `redis+cluster://` URL seeded with every node.
 */
async function startCluster(primaries = 3) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'throttlegate-node-cluster-'));
  const nodes = [];
  const stop = async () => {
    await Promise.all(nodes.map((n) => n.stop()));
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < primaries * 2; i++) {
      const nodeDir = path.join(dir, String(i));
      fs.mkdirSync(nodeDir);
      nodes.push(
        await startRedis([
          '--dir', nodeDir,
          '--cluster-enabled', 'yes',
          '--cluster-node-timeout', '1000',
          '--cluster-replica-validity-factor', '0',
          '--repl-diskless-sync-delay', '0',
        ]),
      );
    }
    const addrs = nodes.map((n) => `127.0.0.1:${n.port}`);
    await new Promise((resolve, reject) => {
      execFile(
        REDIS_CLI,
        ['--cluster', 'create', ...addrs, '--cluster-replicas', '1', '--cluster-yes'],
        { encoding: 'utf8' },
        (err, stdout, stderr) =>
          err ? reject(new Error(`${REDIS_CLI} --cluster create failed: ${err.message}\n${stdout}${stderr}`)) : resolve(),
      );
    });
    const deadline = Date.now() + 30000;
    for (;;) {
      const infos = await Promise.all(nodes.map((n) => n.command(['CLUSTER', 'INFO']).catch(() => '')));
      if (infos.every((i) => i.includes('cluster_state:ok') && i.includes('cluster_slots_ok:16384'))) break;
      if (Date.now() > deadline) throw new Error(`the cluster did not become ok:\n${infos.join('\n')}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return { url: `redis+cluster://${addrs.join(',')}`, nodes, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

function openssl(dir, args) {
  try {
    execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    throw new Error(`openssl ${args.join(' ')} failed: ${err.stderr || err.message}`);
  }
}

/** A P-256 key and a certificate for `subject`, signed by the CA in `dir`, with these v3 extensions. */
function issue(dir, name, subject, extensions) {
  fs.writeFileSync(path.join(dir, `${name}.ext`), extensions.join('\n') + '\n');
  openssl(dir, ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subject]);
  openssl(dir, ['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key',
    '-CAcreateserial', '-days', '2', '-extfile', `${name}.ext`, '-out', `${name}.pem`]);
}

/**
 * A private certificate authority made with the openssl command line, in a
 * new temporary directory: `ca.pem`, a server certificate for `localhost`
 * and 127.0.0.1 (`server.pem`, `server.key`) and a client certificate
 * (`client.pem`, `client.key`). Returns `{ dir, file(name), pem(name), remove() }`.
 */
function makeCertificates() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'throttlegate-node-tls-'));
  openssl(dir, ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=throttlegate test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  issue(dir, 'server', '/CN=localhost', [
    'basicConstraints=critical,CA:FALSE',
    'keyUsage=critical,digitalSignature',
    'extendedKeyUsage=serverAuth',
    'subjectAltName=DNS:localhost,IP:127.0.0.1',
  ]);
  issue(dir, 'client', '/CN=throttlegate test client', [
    'basicConstraints=critical,CA:FALSE',
    'keyUsage=critical,digitalSignature',
    'extendedKeyUsage=clientAuth',
  ]);
  return {
    dir,
    file: (name) => path.join(dir, name),
    pem: (name) => fs.readFileSync(path.join(dir, name)),
    remove: () => fs.rmSync(dir, { recursive: true, force: true }),
  };
}

let prefixes = 0;
/** A key prefix no other test uses. */
function freshPrefix(tag = 't') {
  prefixes += 1;
  return `tgnode:${process.pid}:${tag}:${prefixes}:`;
}

/**
 * Pin a Redis server started here to CPU 0 and this process to CPU 1 (the
 * benchmarks' setup); false when `taskset` cannot.
 */
async function pinToCpus(redis) {
  try {
    const info = await redisCommand(redis.port, ['INFO', 'server']);
    const pid = /process_id:(\d+)/.exec(info)[1];
    execFileSync('taskset', ['-pc', '0', pid], { stdio: 'ignore' });
    execFileSync('taskset', ['-apc', '1', String(process.pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/**
 * One redis-sentinel (Debian's package; $THROTTLEGATE_REDIS_SENTINEL
 * overrides it) monitoring the redis-server on `primaryPort` as service
 * "tg" (quorum 1), on a free port. Resolves to `{ port, url, stop() }`,
 * `url` being its `redis+sentinel://` URL.
 */
async function startSentinel(primaryPort) {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'throttlegate-sentinel-'));
  const conf = path.join(dir, 'sentinel.conf');
  fs.writeFileSync(conf, `port ${port}\nbind 127.0.0.1\ndir ${dir}\nsentinel monitor tg 127.0.0.1 ${primaryPort} 1\n`);
  const child = spawn(process.env.THROTTLEGATE_REDIS_SENTINEL || 'redis-sentinel', [conf], { stdio: 'ignore' });
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  const stop = () =>
    new Promise((resolve) => {
      const done = () => {
        fs.rmSync(dir, { recursive: true, force: true });
        resolve();
      };
      if (exited) return done();
      child.once('exit', done);
      child.kill('SIGKILL');
    });
  for (let i = 0; i < 200 && !exited; i++) {
    try {
      if ((await redisCommand(port, ['PING'])).startsWith('+PONG')) {
        return { port, url: `redis+sentinel://127.0.0.1:${port}/tg`, stop };
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  await stop();
  throw new Error('redis-sentinel did not start');
}

module.exports = {
  startSentinel,
  pinToCpus,
  startRedisAt,
  freePort,
  startRedis,
  startCluster,
  startSilentServer,
  makeCertificates,
  freshPrefix,
  redisCommand,
};
