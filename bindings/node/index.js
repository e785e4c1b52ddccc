// The package: the native addon (prebuilt in a platform package, or built
// from a git checkout by build.js; native.js finds it), with `Limiter.check`
// and `Limiter.peek` made fast here.
//
// - The embedded backend answers in place: one synchronous native call
//   writes the decision as numbers into a Float64Array, and the Promise
//   returned is already resolved.
// - For one Redis node over TCP or a Unix socket, the limiter has a
//   connection of its own on this thread (`Link`): the core makes each
//   call's command and reads each reply (`throttlegate::Wire`), this file
//   only writes the bytes of a tick in one go and hands what the socket
//   reads back to the core. No thread hand-over: an answer costs one read
//   of the socket, as with a JavaScript Redis client.
// - For a cluster or TLS, the checks and peeks issued in the same tick are
//   queued on the native side and run together (their commands pipelined on
//   the multiplexed connection), in a few chunks each settled by one
//   callback into JavaScript. Each call still gets its own outcome: its own
//   decision, or its own error with `code`.
// - A decision's headline figures are plain properties; `results`, `headers`
//   and `problemJson` are made by the core from the decision's numbers the
//   first time they are read. No decision logic lives here.
'use strict';

// The addon: a platform package, or a build from a git checkout (native.js).
const net = require('node:net');
const native = require('./native.js');

const proto = native.Limiter.prototype;
const { bind, setScratch, wireReceived, wireOutput } = native._hotPaths();
const handleOf = proto._handle;
const flushQueued = proto._flush;
const resultsOf = proto._results;
const headersOf = proto._headers;
const problemJsonOf = proto._problemJson;
const ruleTableOf = proto._ruleTable;
const overflowOf = proto._overflow;
const takeLease = proto._takeLease;
const wireAddressOf = proto._wireAddress;
const wireExpire = proto._wireExpire;
const wireConnectFailed = proto._wireConnectFailed;
const wireLost = proto._wireLost;
const wireClose = proto._wireClose;
const nativeClose = proto.close;
// Throws checkSync's error for a limiter whose backend is not in process.
const notInProcess = proto.checkSync;
// A decision record: HEAD numbers, then PER_RULE numbers per rule result
// (the core's `throttlegate::record`, whose documentation has the layout).
const [HEAD, PER_RULE] = native._recordLayout();

// A tick's queued calls go to Rust in about CHUNKS chunks of MIN_CHUNK to
// MAX_CHUNK calls (see `flush`).
const CHUNKS = 4;
const MIN_CHUNK = 8;
const MAX_CHUNK = 64;
// `checkNow` and `wireBegin` return `undefined` when the decision is in the
// scratch buffer.
// What `checkNow` returns when the backend is not in process.
const NOT_IN_PROCESS = -1;
// What `checkNow` returns when the decision did not fit the scratch buffer
// (a reload brought more rules): the record is read with `_overflow()`.
const OVERFLOW = -2;
// The flag of a record whose decision holds concurrency slots (its lease id
// travels beside the record: `_takeLease()`, a batch's `leases`).
const LEASED = 4;
// What `wireBegin` returns when the call is on its way (answered later by id).
const SENT = -1;
// What `wireBegin` returns when the call does not go on the wire (a reserved rule applies).
const NO_WIRE = -3;
// Calls whose commands are written at once, without waiting for the tick's end (see `Link.add`).
const WRITE_EVERY = 16;
// Calls whose decisions one read can hand over in the scratch buffer (more
// come as arrays: `Link.settle`).
const WIRE_CALLS = 64;
// The bytes of one write that go through the connection's own buffer (more
// come in a Buffer of their own).
const OUT_BYTES = 16 * 1024;
// How long a connection that could not be made waits before its one more try.
const RECONNECT_DELAY_MS = 10;

/**
 * The answer to one check: the most restrictive rule's figures as the
 * headline, and every applied rule's result (see `Decision` in index.d.ts).
 *
 * `results`, `headers` and `problemJson` are computed by the core when first
 * read, then kept; `toJSON()` (and so `JSON.stringify`) includes them.
 */
class Decision {
  #limiter;
  #record;
  // What only some decisions need, made when first needed (`Later`).
  #later;

  /**
   * `lease`: the lease id of the slots the decision holds (its record is
   * flagged LEASED), else null; `attributes`: the check's, kept (a copy)
   * only with a lease, for `release` and `extend`.
   */
  constructor(limiter, records, offset, calls, lease = null, attributes = undefined) {
    const flags = records[offset + 1];
    const rule = records[offset + 6];
    this.allowed = (flags & 1) !== 0;
    this.limit = records[offset + 2];
    this.remaining = records[offset + 3];
    this.retryAfterMs = records[offset + 4];
    this.resetAfterMs = records[offset + 5];
    this.rule = rule < 0 ? null : ruleName(limiter, calls, rule);
    this.degraded = (flags & 2) !== 0;
    this.leaseId = lease;
    this.#limiter = limiter;
    // A copy: a decision kept for long holds its own few numbers, not a
    // buffer that others share.
    this.#record = offset === 0 && records[0] === ONE_RULE ? copyOne(records) : copy(records, offset);
    this.#later = lease === null ? undefined : leaseLater(attributes);
  }

  /** The decision's `Later`, made on first need. */
  #more() {
    if (this.#later === undefined) this.#later = new Later(undefined);
    return this.#later;
  }

  /** One result per applied rule, in policy order (shadow rules included). */
  get results() {
    const later = this.#more();
    if (later.results === undefined) later.results = resultsOf.call(this.#limiter, this.#record);
    return later.results;
  }

  set results(value) {
    this.#more().results = value;
  }

  /** The HTTP headers for this decision, in order (`RateLimit-*`, `Retry-After` on a denial). */
  get headers() {
    const later = this.#more();
    if (later.headers === undefined) later.headers = headersOf.call(this.#limiter, this.#record);
    return later.headers;
  }

  set headers(value) {
    this.#more().headers = value;
  }

  /** On a denial, an `application/problem+json` body naming the violated rules; `null` when allowed. */
  get problemJson() {
    const later = this.#more();
    if (later.problemJson === undefined) {
      later.problemJson = problemJsonOf.call(this.#limiter, this.#record);
    }
    return later.problemJson;
  }

  set problemJson(value) {
    this.#more().problemJson = value;
  }

  /** Every field as a plain object, in the documented order. */
  toJSON() {
    return {
      allowed: this.allowed,
      limit: this.limit,
      remaining: this.remaining,
      retryAfterMs: this.retryAfterMs,
      resetAfterMs: this.resetAfterMs,
      rule: this.rule,
      results: this.results,
      degraded: this.degraded,
      leaseId: this.leaseId,
      headers: this.headers,
      problemJson: this.problemJson,
    };
  }

  [Symbol.for('nodejs.util.inspect.custom')](depth, options, inspect) {
    return inspect(this.toJSON(), options);
  }

  /** The record of a decision made here (`undefined` for anything else). */
  static recordOf(d) {
    return d !== null && typeof d === 'object' && #record in d ? d.#record : undefined;
  }

  /** The check's attributes of a decision made here holding a lease (`undefined` for anything else). */
  static leaseAttributesOf(d) {
    return d !== null && typeof d === 'object' && #record in d && d.#later !== undefined
      ? d.#later.leaseAttributes
      : undefined;
  }
}

/** The record at `offset` of `records`, as an array. */
function copy(records, offset) {
  const length = HEAD + PER_RULE * records[offset];
  const record = new Array(length);
  for (let i = 0; i < length; i++) record[i] = records[offset + i];
  return record;
}

/**
 * `copy` of a record of one rule result (HEAD + PER_RULE = 16 numbers) at
 * the start of `r`: an array literal, made in place by the compiled code.
 * (Small, as is all that `checkSync` calls per check, so that the compiler
 * inlines all of it, the `Decision`'s allocation included.)
 */
function copyOne(r) {
  return [r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]];
}

/** The `Later` of a decision holding a lease: the check's attributes, a copy. */
function leaseLater(attributes) {
  return new Later({ ...attributes });
}
// Whether `copyOne` fits the addon's record layout (else every record is `copy`'d).
const ONE_RULE = HEAD + PER_RULE === 16 ? 1 : -1;

/**
 * What a `Decision` holds beyond its numbers, only once needed: the check's
 * attributes (a copy) when it holds a lease, and `results`, `headers` and
 * `problemJson` once read or set.
 */
class Later {
  constructor(leaseAttributes) {
    this.leaseAttributes = leaseAttributes;
    this.results = undefined;
    this.headers = undefined;
    this.problemJson = undefined;
  }
}

// What `settle` needs of a check made with a `callId`: its attributes (a
// copy), call id and cost. Set only on those decisions, off the hot path.
const kSettle = Symbol('throttlegate.settle');

function settleable(attributes, options) {
  return (decision) => {
    Object.defineProperty(decision, kSettle, {
      value: { attributes: { ...attributes }, callId: options.callId, cost: options.cost ?? 1 },
    });
    return decision;
  };
}

/**
 * The name of rule number `n` of a decision record. The numbers stay with
 * their names across reloads; a number not seen yet (a reload brought a new
 * rule) reads the limiter's table again.
 */
function ruleName(limiter, calls, n) {
  if (n >= calls.names.length) calls.names = ruleTableOf.call(limiter);
  return calls.names[n];
}

/** A limiter's calls in progress: its buffer for embedded records, or its queued Redis calls. */
class Calls {
  constructor(limiter) {
    const backend = limiter.backend;
    this.handle = handleOf.call(limiter);
    // The limiter's own `checkNow`, `checkValues`, `enqueue` and `wireBegin` (see `fast`).
    const paths = bind(this.handle);
    this.checkNow = paths.checkNow;
    this.checkValues = paths.checkValues;
    this.enqueue = paths.enqueue;
    this.wireBegin = paths.wireBegin;
    this.names = ruleTableOf.call(limiter);
    // A limiter closed before its first call answers in place too (with the error).
    this.inProcess = backend === 'memory' || backend === 'closed';
    // The limiter's own connection, when the core has a wire for its backend.
    const address = this.inProcess ? null : wireAddressOf.call(limiter);
    // Where decisions answered in place are written (kept here, so alive,
    // for the limiter's life); with a connection, also those of a read that
    // settles up to WIRE_CALLS calls (`Link.settleWritten`).
    const record = HEAD + PER_RULE * this.names.length;
    this.scratch = new Float64Array(address === null ? record : WIRE_CALLS * (1 + record));
    setScratch(this.handle, this.scratch);
    // The attribute names of the last call that passed them as separate
    // strings (see `fast`), and how many.
    this.keys = ['', '', '', ''];
    this.keyCount = -1;
    this.resolves = [];
    this.rejects = [];
    // The attributes of each queued call (kept by the decisions holding a lease).
    this.attributes = [];
    this.scheduled = false;
    this.link = address === null ? null : new Link(limiter, this, address);
  }
}

/**
 * A limiter's connection to its Redis node, on this thread. The core says
 * what to write and what each reply means (`throttlegate::Wire`); this only
 * moves bytes: the commands of a tick in one write, every read handed back
 * at once. A connection that cannot be made is tried once more after
 * RECONNECT_DELAY_MS; a lost one fails the calls sent on it, and the next
 * call connects anew. The socket holds the event loop only while calls wait.
 */
class Link {
  constructor(limiter, calls, address) {
    this.limiter = limiter;
    this.calls = calls;
    this.address = address;
    this.socket = null;
    // id -> [resolve, reject] of each call on its way.
    this.waiting = new Map();
    this.nextId = 0;
    this.scheduled = false;
    // Calls begun since the last write.
    this.unwritten = 0;
    this.timer = null;
    this.retrying = false;
    this.fresh();
  }

  /**
   * A new buffer for the bytes of the next writes (`wireOutput` copies them
   * there; a write of the same length reuses the view of the last one).
   * The old one is left to the writes that still hold it.
   */
  fresh() {
    this.out = Buffer.allocUnsafeSlow(OUT_BYTES);
    this.view = this.out.subarray(0, 0);
  }

  /**
   * A call is on its way: its command goes out with the tick's others when
   * the tick ends, or at once when WRITE_EVERY are waiting to be written
   * (so Redis works on the first ones while JavaScript issues the rest).
   */
  add(resolve, reject, id, attributes) {
    this.waiting.set(id, [resolve, reject, attributes]);
    this.unwritten += 1;
    if (this.unwritten >= WRITE_EVERY) {
      this.write();
    } else if (!this.scheduled) {
      this.scheduled = true;
      process.nextTick(writeLink, this);
    }
  }

  write() {
    this.scheduled = false;
    this.unwritten = 0;
    if (this.retrying) return;
    if (this.socket === null) this.connect();
    const out = wireOutput(this.calls.handle, this.out);
    if (typeof out !== 'number') {
      this.socket.write(out);
    } else if (out > 0) {
      if (this.view.length !== out) this.view = this.out.subarray(0, out);
      this.socket.write(this.view);
      // Still queued (not yet connected, or the kernel took part of it):
      // the next commands go to a buffer of their own.
      if (this.socket.writableLength > 0) this.fresh();
    }
    if (this.waiting.size > 0) {
      this.socket.ref();
      this.arm(this.address.timeoutMs);
    }
  }

  connect() {
    const a = this.address;
    const socket = a.path !== undefined ? net.connect(a.path) : net.connect(a.port, a.host);
    socket.setNoDelay(true);
    this.socket = socket;
    let opened = false;
    let failure = null;
    socket.on('connect', () => {
      opened = true;
    });
    socket.on('data', (chunk) => {
      if (this.socket !== socket) return;
      const out = wireReceived(this.calls.handle, chunk);
      if (typeof out === 'number') this.settleWritten(out);
      else if (out !== null) this.settle(out);
    });
    socket.on('error', (err) => {
      failure = err;
    });
    socket.on('close', () => {
      if (this.socket !== socket) return;
      this.socket = null;
      const errno = failure !== null && typeof failure.errno === 'number' ? failure.errno : undefined;
      if (!opened && !this.retried) {
        // Nothing reached the server: write it all again on one more try.
        this.retried = true;
        this.retrying = true;
        wireConnectFailed.call(this.limiter);
        setTimeout(() => {
          this.retrying = false;
          this.write();
        }, RECONNECT_DELAY_MS);
        return;
      }
      this.retried = false;
      this.settle(wireLost.call(this.limiter, errno));
    });
    socket.once('data', () => {
      this.retried = false;
    });
  }

  /**
   * Wake in `ms` for the next deadline, unless a wake-up is set already (it
   * is then earlier: calls are sent in order). The timer never holds the
   * event loop; the socket does while calls wait.
   */
  arm(ms) {
    if (this.timer !== null) return;
    this.timer = setTimeout(expireLink, Math.max(1, Math.ceil(ms)), this);
    this.timer.unref();
  }

  /** Settle what the core settled: `[keep, ids, [records, errors, leases], nextMs, output]`. */
  settle(out) {
    const [keep, ids, [records, errors, leases], , output] = out;
    let leaseAt = 0;
    if (!keep) this.drop();
    else if (output !== null && this.socket !== null) this.socket.write(output);
    let offset = 0;
    for (let i = 0; i < ids.length; i++) {
      const call = this.waiting.get(ids[i]);
      this.waiting.delete(ids[i]);
      const n = records[offset];
      if (n < 0) {
        call[1](errors[i]);
        offset += 1;
      } else {
        const lease = (records[offset + 1] & LEASED) !== 0 ? leases[leaseAt++] : null;
        call[0](new Decision(this.limiter, records, offset, this.calls, lease, call[2]));
        offset += HEAD + PER_RULE * n;
      }
    }
    if (this.waiting.size === 0 && this.socket !== null) this.socket.unref();
  }

  /**
   * Settle the `n` calls whose decisions a read wrote to the scratch
   * buffer, `[id, record...]` each (none failed or holds a lease).
   */
  settleWritten(n) {
    const records = this.calls.scratch;
    let offset = 0;
    for (let i = 0; i < n; i++) {
      const id = records[offset];
      const call = this.waiting.get(id);
      this.waiting.delete(id);
      call[0](new Decision(this.limiter, records, offset + 1, this.calls, null, call[2]));
      offset += 1 + HEAD + PER_RULE * records[offset + 1];
    }
    if (this.waiting.size === 0 && this.socket !== null) this.socket.unref();
  }

  /** Close the socket without waiting for its events. */
  drop() {
    const socket = this.socket;
    this.socket = null;
    if (socket !== null) socket.destroy();
  }

  close() {
    this.settle(wireClose.call(this.limiter));
    this.drop();
  }
}

function writeLink(link) {
  link.write();
}

function expireLink(link) {
  link.timer = null;
  if (link.waiting.size === 0) return;
  const out = wireExpire.call(link.limiter);
  link.settle(out);
  if (out[3] >= 0) link.arm(out[3]);
}

const kCalls = Symbol('throttlegate.calls');

function callsOf(limiter) {
  let calls = limiter[kCalls];
  if (calls === undefined) {
    calls = new Calls(limiter);
    Object.defineProperty(limiter, kCalls, { value: calls });
  }
  return calls;
}

// How many attributes the last `pack` packed.
let packedPairs = 0;

/**
 * The attributes as one string, `name \0 value \0` for each string value
 * (`undefined` and `null` values are absent), for more than SPLIT_PAIRS of
 * them: one string crosses into Rust faster than an object is read from
 * there. `undefined` when the object has anything else: the native side
 * then reads the object itself, and reports what is wrong with it.
 */
function pack(attributes) {
  if (typeof attributes !== 'object' || attributes === null || Array.isArray(attributes)) return undefined;
  const names = Object.keys(attributes);
  let text = '';
  let pairs = 0;
  for (let i = 0; i < names.length; i++) {
    const name = names[i];
    const value = attributes[name];
    if (typeof value === 'string') {
      text = text + name + '\0' + value + '\0';
      pairs += 1;
    } else if (value !== undefined && value !== null) {
      return undefined;
    }
  }
  packedPairs = pairs;
  return text;
}

// Up to SPLIT_PAIRS attributes with a string value cross as separate
// strings, `name, value` each, after the fast path's fixed arguments: no
// string is made here for them, and the native side reads each once. More
// are packed into one string (`pack`).
const SPLIT_PAIRS = 4;
// The flag of a call whose attributes come as separate strings.
const SPLIT = 4;
// The flag of a split call whose names are those the limiter's last split
// call passed (`Calls.keys`): only the values cross, the native side has
// the names' bytes kept.
const SAME = 8;
// The names and values of the call being made (overwritten by the next).
const parts = ['', '', '', '', '', '', '', ''];

/**
 * Call the fast path `fn` (`checkNow`, `enqueue` or `wireBegin`) of the
 * limiter whose `Calls` are `calls` with its arguments `(attributes,
 * packed, flags, options, id, ...strings)`: the attributes as
 * separate strings when they are a plain object of at most SPLIT_PAIRS
 * string values (`undefined` and `null` values are absent), only the
 * values when the names are the ones the limiter's last such call passed,
 * packed when there are more, else as the object itself, which the native
 * side then reads and reports what is wrong with. `flags` is `16 * pairs
 * + 8 * (same names) + 4 * (split) + 2 * (options given) + (peek)`.
 */
function fast(fn, calls, attributes, options, peek, id) {
  const base = (options === undefined || options === null ? 0 : 2) + (peek ? 1 : 0);
  if (typeof attributes !== 'object' || attributes === null || Array.isArray(attributes)) {
    return fn(attributes, undefined, base, options, id);
  }
  const names = Object.keys(attributes);
  let pairs = 0;
  for (let i = 0; i < names.length; i++) {
    const name = names[i];
    const value = attributes[name];
    if (typeof value === 'string') {
      if (pairs === SPLIT_PAIRS) {
        const text = pack(attributes);
        return fn(attributes, text, base + 16 * packedPairs, options, id);
      }
      parts[2 * pairs] = name;
      parts[2 * pairs + 1] = value;
      pairs += 1;
    } else if (value !== undefined && value !== null) {
      return fn(attributes, undefined, base, options, id);
    }
  }
  // The same names as the last split call (the native side keeps those):
  // compared before the call, and taken as the kept ones before it, as the
  // native side keeps them before anything that can call back here.
  const keys = calls.keys;
  let same = pairs === calls.keyCount;
  for (let i = 0; same && i < pairs; i++) same = keys[i] === parts[2 * i];
  if (same && base === 0 && fn === calls.checkNow) {
    // A check without options: `checkValues`, the object and the values alone.
    const values = calls.checkValues;
    switch (pairs) {
      case 0:
        return values(attributes);
      case 1:
        return values(attributes, parts[1]);
      case 2:
        return values(attributes, parts[1], parts[3]);
      case 3:
        return values(attributes, parts[1], parts[3], parts[5]);
      default:
        return values(attributes, parts[1], parts[3], parts[5], parts[7]);
    }
  }
  if (same) {
    const flags = base + SPLIT + SAME + 16 * pairs;
    switch (pairs) {
      case 0:
        return fn(attributes, undefined, flags, options, id);
      case 1:
        return fn(attributes, undefined, flags, options, id, parts[1]);
      case 2:
        return fn(attributes, undefined, flags, options, id, parts[1], parts[3]);
      case 3:
        return fn(attributes, undefined, flags, options, id, parts[1], parts[3], parts[5]);
      default:
        return fn(attributes, undefined, flags, options, id, parts[1], parts[3], parts[5], parts[7]);
    }
  }
  for (let i = 0; i < pairs; i++) keys[i] = parts[2 * i];
  calls.keyCount = pairs;
  const flags = base + SPLIT + 16 * pairs;
  switch (pairs) {
    case 0:
      return fn(attributes, undefined, flags, options, id);
    case 1:
      return fn(attributes, undefined, flags, options, id, parts[0], parts[1]);
    case 2:
      return fn(attributes, undefined, flags, options, id, parts[0], parts[1], parts[2], parts[3]);
    case 3:
      return fn(attributes, undefined, flags, options, id, parts[0], parts[1], parts[2], parts[3],
        parts[4], parts[5]);
    default:
      return fn(attributes, undefined, flags, options, id, parts[0], parts[1], parts[2], parts[3],
        parts[4], parts[5], parts[6], parts[7]);
  }
}

function answerNow(limiter, calls, attributes, options, peek) {
  let status;
  try {
    status = fast(calls.checkNow, calls, attributes, options, peek, 0);
  } catch (err) {
    return Promise.reject(err);
  }
  if (status === NOT_IN_PROCESS) {
    calls.inProcess = false;
    return queue(limiter, calls, attributes, options, peek);
  }
  return answered(limiter, calls, status, attributes);
}

/**
 * The decision the native side wrote in place (to the scratch buffer, or
 * for `OVERFLOW` one too long for it, which also grows the buffer).
 */
function answered(limiter, calls, status, attributes) {
  return Promise.resolve(decisionWritten(limiter, calls, status, attributes));
}

/**
 * `answered`'s decision itself (with the lease id it holds, if any). Small
 * (see `copyOne`): anything but a decision in the scratch buffer holding
 * no lease is `decisionElsewhere`'s.
 */
function decisionWritten(limiter, calls, status, attributes) {
  if (status !== undefined || (calls.scratch[1] & LEASED) !== 0) {
    return decisionElsewhere(limiter, calls, status, attributes);
  }
  return new Decision(limiter, calls.scratch, 0, calls, null, attributes);
}

/** `decisionWritten` of a decision too long for the scratch buffer, or holding a lease. */
function decisionElsewhere(limiter, calls, status, attributes) {
  if (status === OVERFLOW) {
    const record = overflowOf.call(limiter);
    calls.scratch = new Float64Array(record.length);
    setScratch(calls.handle, calls.scratch);
    const lease = (record[1] & LEASED) !== 0 ? takeLease.call(limiter) : null;
    return new Decision(limiter, record, 0, calls, lease, attributes);
  }
  const lease = (calls.scratch[1] & LEASED) !== 0 ? takeLease.call(limiter) : null;
  return new Decision(limiter, calls.scratch, 0, calls, lease, attributes);
}

/**
 * `check` answered synchronously, for the embedded backend: no Promise, the
 * decision returned (or the error thrown) at once. A number for `options`
 * is the cost. `Limiter.prototype.checkSync` itself (no call more).
 */
function checkSync(attributes, options) {
  const limiter = this;
  const calls = callsOf(limiter);
  if (!calls.inProcess) notInProcess.call(limiter);
  if (typeof options === 'number') options = { cost: options };
  const status = fast(calls.checkNow, calls, attributes, options, false, 0);
  if (status === NOT_IN_PROCESS) {
    calls.inProcess = false;
    notInProcess.call(limiter);
  }
  const decision = decisionWritten(limiter, calls, status, attributes);
  return options === undefined ? decision : settleableSync(decision, attributes, options);
}

/** `checkSync`'s decision, made settleable when the check had a call id. */
function settleableSync(decision, attributes, options) {
  if (options !== null && options.callId != null) return settleable(attributes, options)(decision);
  return decision;
}

/** A call on the limiter's own connection (`Link`). */
function send(limiter, calls, attributes, options, peek) {
  const link = calls.link;
  const id = link.nextId;
  link.nextId = (id + 1) | 0;
  let status;
  try {
    status = fast(calls.wireBegin, calls, attributes, options, peek, id >>> 0);
  } catch (err) {
    return Promise.reject(err);
  }
  if (status === SENT) {
    return new Promise((resolve, reject) => link.add(resolve, reject, id >>> 0, attributes));
  }
  // A reserved rule's call: the core answers it from its reservations (or takes them).
  if (status === NO_WIRE) return queue(limiter, calls, attributes, options, peek);
  return answered(limiter, calls, status, attributes);
}

function queue(limiter, calls, attributes, options, peek) {
  try {
    fast(calls.enqueue, calls, attributes, options, peek, 0);
  } catch (err) {
    return Promise.reject(err);
  }
  const promise = new Promise((resolve, reject) => {
    calls.resolves.push(resolve);
    calls.rejects.push(reject);
  });
  calls.attributes.push(attributes);
  if (!calls.scheduled) {
    calls.scheduled = true;
    process.nextTick(flush, limiter, calls);
  }
  return promise;
}

/**
 * Send the calls queued in this tick to Rust, in a few chunks that settle
 * on their own: the first chunk's answers come back while Redis still works
 * on the others, so JavaScript issues the next checks while Redis is busy
 * (one batch settled at once leaves Redis idle while JavaScript works; per
 * call, the thread hops cost more than the checks).
 */
function flush(limiter, calls) {
  const all = calls.resolves.length;
  const chunk = Math.min(MAX_CHUNK, Math.max(MIN_CHUNK, Math.ceil(all / CHUNKS)));
  for (let from = 0; from < all; from += chunk) {
    const to = Math.min(all, from + chunk);
    flushChunk(limiter, calls, calls.resolves.slice(from, to), calls.rejects.slice(from, to),
      calls.attributes.slice(from, to));
  }
  calls.resolves = [];
  calls.rejects = [];
  calls.attributes = [];
  calls.scheduled = false;
}

function flushChunk(limiter, calls, resolves, rejects, attributes) {
  const failAll = (err) => {
    for (const reject of rejects) reject(err);
  };
  let batch;
  try {
    batch = flushQueued.call(limiter, resolves.length);
  } catch (err) {
    failAll(err);
    return;
  }
  batch.then(([records, errors, leases]) => {
    let offset = 0;
    let leaseAt = 0;
    for (let i = 0; i < resolves.length; i++) {
      const n = records[offset];
      if (n < 0) {
        rejects[i](errors[i]);
        offset += 1;
      } else {
        const lease = (records[offset + 1] & LEASED) !== 0 ? leases[leaseAt++] : null;
        resolves[i](new Decision(limiter, records, offset, calls, lease, attributes[i]));
        offset += HEAD + PER_RULE * n;
      }
    }
  }, failAll);
}

// The native `check` and `peek` only declare the types (index.d.ts). Replaced
// once per addon, even if this file is evaluated again (a cleared require cache).
const kFast = Symbol.for('throttlegate.fastPaths');
if (!Object.prototype.hasOwnProperty.call(proto, kFast)) {
  Object.defineProperty(proto, kFast, { value: true });

  proto.check = function check(attributes, options) {
    const calls = callsOf(this);
    const answer = calls.inProcess
      ? answerNow(this, calls, attributes, options, false)
      : calls.link !== null
        ? send(this, calls, attributes, options, false)
        : queue(this, calls, attributes, options, false);
    if (options !== undefined && options !== null && options.callId != null) {
      return answer.then(settleable(attributes, options));
    }
    return answer;
  };

  proto.checkSync = checkSync;

  // A decision of a check with a call id settles by that id (`settleCall`);
  // any other is given to the core as recorded, which says why it cannot.
  proto.settle = function settle(decision, actualCost) {
    const ticket = decision !== null && typeof decision === 'object' ? decision[kSettle] : undefined;
    if (ticket !== undefined && decision.allowed && !decision.degraded) {
      return this.settleCall(ticket.attributes, ticket.callId, ticket.cost, actualCost);
    }
    return this._settleDecision(Decision.recordOf(decision), actualCost);
  };

  proto.acquire = function acquire(attributes, options) {
    const calls = callsOf(this);
    return this._acquire(attributes, options).then(([records, , leases]) => {
      const lease = (records[1] & LEASED) !== 0 ? leases[0] : null;
      return new Decision(this, records, 0, calls, lease, attributes);
    });
  };

  // A decision holding slots releases them by its lease id (`releaseCall`);
  // any other is given to the core as recorded (it holds nothing to release).
  proto.release = function release(decision) {
    const attributes = Decision.leaseAttributesOf(decision);
    if (attributes !== undefined) return this.releaseCall(attributes, decision.leaseId);
    return this._releaseDecision(Decision.recordOf(decision));
  };

  proto.extend = function extend(decision, ms) {
    const attributes = Decision.leaseAttributesOf(decision);
    if (attributes !== undefined) return this.extendCall(attributes, decision.leaseId, ms);
    return this._extendDecision(Decision.recordOf(decision), ms);
  };

  proto.peek = function peek(attributes, options) {
    const calls = callsOf(this);
    return calls.inProcess
      ? answerNow(this, calls, attributes, options, true)
      : calls.link !== null
        ? send(this, calls, attributes, options, true)
        : queue(this, calls, attributes, options, true);
  };

  // Closing fails the calls waiting on the limiter's own connection with
  // code `closed`, as it does those queued for the native side.
  proto.close = function close() {
    const promise = nativeClose.call(this);
    const calls = this[kCalls];
    if (calls !== undefined && calls.link !== null) calls.link.close();
    return promise;
  };
}

const api = {};
for (const name of Object.keys(native)) {
  if (!name.startsWith('_')) api[name] = native[name];
}
module.exports = api;
