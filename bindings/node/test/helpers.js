// Test support: real redis-server processes on free loopback ports, and
// loopback listeners that accept connections and never answer.
'use strict';

const { spawn } = require('node:child_process');
const net = require('node:net');

const REDIS_SERVER = process.env.REDIS_SERVER || 'redis-server';

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

/** Send one RESP command and resolve with the raw reply text. */
function redisCommand(port, args) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let reply = '';
    sock.setEncoding('utf8');
    sock.once('error', reject);
    sock.on('data', (chunk) => {
      reply += chunk;
      if (reply.endsWith('\r\n')) {
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
 * `{ port, url, stop() }` once it answers PING.
 */
async function startRedis(extraArgs = []) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const child = spawn(
      REDIS_SERVER,
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...extraArgs],
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
          return { port, url: `redis://127.0.0.1:${port}`, stop, command: (args) => redisCommand(port, args) };
        }
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 25));
    }
    child.kill('SIGKILL');
  }
  throw new Error(`could not start ${REDIS_SERVER}`);
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

let prefixes = 0;
/** A key prefix no other test uses. */
function freshPrefix(tag = 't') {
  prefixes += 1;
  return `tgnode:${process.pid}:${tag}:${prefixes}:`;
}

module.exports = { freePort, startRedis, startSilentServer, freshPrefix, redisCommand };
