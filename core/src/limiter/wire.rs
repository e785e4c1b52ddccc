//! Checks on one Redis node for a front end that moves the bytes itself
//! ([`Wire`]): the core says what to send and what each reply means, the
//! front end only writes and reads a socket on its own event loop (Node's
//! JavaScript thread), so an answer needs no thread hand-over at all.
//!
//! Everything a check means stays here, as on the async and blocking paths:
//! the same plan, deny cache and metrics ([`Limiter::before_send`] and
//! [`Limiter::after_send`]), the same command (`EVALSHA`, then on NOSCRIPT
//! `SCRIPT LOAD` and a retry, then the whole script), the same error for
//! each reply, the same timeout. The connection's rules: commands are
//! pipelined in call order and answered in that order; a call not answered
//! within the timeout gets the timeout error (its reply is still read and
//! dropped when it comes); a connection whose oldest request has waited
//! [`STALE_AFTER`] past the timeout is given up (the server is gone or
//! stuck), and every call still on it gets the timeout error; a lost
//! connection fails the calls sent on it with the loss's error (they may
//! have been applied, so they are never sent again), and the next call
//! connects anew; calls written on a connection that never opened are sent
//! again on the next attempt.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use smallvec::SmallVec;

use super::{AttrRef, Generation, Limiter, Sent};
use crate::backend::redis::RedisBackend;
use crate::backend::script::{command, ext_refs, is_noscript, override_error, parse_check_reply, Header, Ints, CHECK_SCRIPT};
use crate::decision::Decision;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Attributes;
use crate::plan::{Mode, Plan, PlanExt};
use crate::CheckOptions;

/// How long past its timeout the oldest unanswered request of a connection
/// may wait before the connection is given up (the async path's client
/// bound is the same slack over the timeout).
pub const STALE_AFTER: Duration = Duration::from_millis(50);

/// Where a [`Wire`] connects: the Redis URL's host and port, or its Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireAddress {
    /// A TCP host and port.
    Tcp {
        /// The host name or address, as the URL gives it.
        host: String,
        /// The port.
        port: u16,
    },
    /// The path of a Unix socket.
    Unix(String),
}

/// The calls of one limiter on one connection to one Redis node, without
/// the I/O: [`Wire::begin`] a call, write [`Wire::take_output`] on the
/// socket, hand every byte read to [`Wire::received`], call
/// [`Wire::expire`] when [`Wire::next_deadline`] passes, and report the
/// socket's end with [`Wire::connect_failed`] or [`Wire::lost`]. Answers come
/// out as `(id, outcome)` pairs, with the id given to [`Wire::begin`].
///
/// Made by [`Limiter::wire`]; single-threaded (the front end's event loop).
pub struct Wire {
    limiter: Limiter,
    /// The node (for what it knows of the server's clock).
    node: RedisBackend,
    sha: String,
    timeout: Duration,
    address: WireAddress,
    /// `AUTH` and `SELECT`, as the URL asks (sent first on every connection).
    handshake: Vec<u8>,
    handshake_replies: usize,
    /// What the connection waits for, in the order the replies come.
    slots: VecDeque<Slot>,
    /// Bytes read and not yet a whole reply.
    input: Vec<u8>,
    /// Bytes to write.
    output: Vec<u8>,
    /// The handshake is written on the current connection.
    open: bool,
}

/// What one or more replies of the connection belong to.
enum Slot {
    /// The handshake's replies (an error reply ends the connection), due by `due`.
    Handshake { left: usize, due: Instant },
    /// A call waiting for its replies.
    Call(Box<Flight>),
    /// A call answered already (it timed out at `due`): its replies are read and dropped.
    Dropped { left: usize, due: Instant },
}

/// Which command of a call is out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `EVALSHA`.
    First,
    /// `SCRIPT LOAD` then `EVALSHA`, after NOSCRIPT.
    Loaded,
    /// `EVAL` of the whole script, after NOSCRIPT twice.
    Whole,
}

/// A call on its way: the plan's parts (its rules located in `g`), and
/// what `after_send` needs.
struct Flight {
    id: u32,
    g: Arc<Generation>,
    keys: SmallVec<[String; 4]>,
    rules: SmallVec<[(usize, Option<usize>); 4]>,
    ext: Vec<PlanExt<String>>,
    cost: u64,
    call_id: Option<String>,
    /// The call id sent: the caller's, or a random one.
    sent_id: String,
    /// The lease id of its concurrency rules (the id sent), if any applies.
    lease: Option<String>,
    mode: Mode,
    cached: bool,
    sent_us: Option<i64>,
    now: Option<i64>,
    started: Option<Instant>,
    deadline: Instant,
    /// The deadline on the server's clock the check's commands carry.
    server_deadline: Option<i64>,
    stage: Stage,
    left: usize,
    replies: SmallVec<[Value; 2]>,
    /// The commands of the current stage, kept to be written again if the
    /// connection they were written on never opened.
    request: Vec<u8>,
}

/// The outcomes [`Wire`] hands back: `(id, outcome)` per call, in the order they were settled.
pub type WireOutcomes = Vec<(u32, Result<Decision>)>;

impl Limiter {
    /// A [`Wire`] for this limiter, when its backend is one Redis node
    /// reached over plain TCP or a Unix socket with RESP2 (`None` for the
    /// embedded backend, a cluster, TLS, RESP3, or once closed: use the
    /// async methods there; also with `wait_replicas`, whose `WAIT` only
    /// the core's own calls send).
    pub fn wire(&self) -> Option<Wire> {
        let node = self.inner.remote.as_ref()?.redis_node()?;
        if node.wait_replicas() > 0 {
            return None;
        }
        Wire::new(self.clone(), &node)
    }
}

impl Wire {
    fn new(limiter: Limiter, node: &RedisBackend) -> Option<Wire> {
        let (client, sha, timeout) = node.parts();
        let info = client.get_connection_info();
        let address = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => WireAddress::Tcp { host: host.clone(), port: *port },
            redis::ConnectionAddr::Unix(path) => WireAddress::Unix(path.to_str()?.to_string()),
            _ => return None,
        };
        let settings = info.redis_settings();
        if settings.protocol() != redis::ProtocolVersion::RESP2 {
            return None;
        }
        let mut handshake = Vec::new();
        let mut handshake_replies = 0;
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).write_packed_command(&mut handshake);
            handshake_replies += 1;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT").arg(settings.db()).write_packed_command(&mut handshake);
            handshake_replies += 1;
        }
        Some(Wire {
            limiter,
            node: node.clone(),
            sha: sha.to_string(),
            timeout,
            address,
            handshake,
            handshake_replies,
            slots: VecDeque::new(),
            input: Vec::new(),
            output: Vec::new(),
            open: false,
        })
    }

    /// Where to connect.
    pub fn address(&self) -> &WireAddress {
        &self.address
    }

    /// The limiter's timeout: how long a call waits for its answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// True when no reply is awaited (the socket may stop holding the event loop).
    pub fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether this call has a reserved rule (`reserve`), which the wire does
    /// not carry: such a call goes through [`Limiter::check_batch`] (or
    /// [`Limiter::check`]), which answers it from this limiter's
    /// reservations or takes them. False at once when no rule is reserved.
    pub fn reserved<A: Attributes + ?Sized>(&self, attrs: &A, options: &CheckOptions, peek: bool) -> bool {
        let g = self.limiter.inner.current.load();
        if !g.rules.any_reserved() {
            return false;
        }
        let call_id = if peek { None } else { options.call_id.as_deref() };
        let reserved = match g.rules.plan(&AttrRef(attrs), options.cost, call_id, str::to_string) {
            Ok(plan) => super::reserve::has_reserved(&plan),
            Err(_) => false,
        };
        reserved
    }

    /// Start a check (or a peek): `Some` when it is answered without the
    /// network (bad arguments, no rule applies, a remembered denial, a closed
    /// limiter), else `None` and its command is in [`Wire::take_output`],
    /// its answer to come from [`Wire::received`] or [`Wire::expire`] under `id`.
    pub fn begin<A: Attributes + ?Sized>(&mut self, id: u32, attrs: &A, options: &CheckOptions, peek: bool) -> Option<Result<Decision>> {
        if self.limiter.is_closed() {
            return Some(Err(Error::closed()));
        }
        let (mode, call_id) = if peek { (Mode::Peek, None) } else { (Mode::Check, options.call_id.as_deref()) };
        let g = self.limiter.inner.current.load_full();
        let plan = match g.rules.plan(&AttrRef(attrs), options.cost, call_id, str::to_string) {
            Ok(plan) => plan,
            Err(e) => return Some(Err(e)),
        };
        let sent = match self.limiter.before_send(&g, &plan) {
            Ok((_, sent)) => sent,
            Err(answer) => return Some(answer),
        };
        // A check of a concurrency rule sends its lease id as its call id; a
        // check without a call id sends none (`backend::node_call_id`).
        let sent_id = match (&plan.lease, call_id) {
            (Some(lease), _) => lease.clone(),
            (None, id) => id.unwrap_or_default().to_string(),
        };
        let mut request = Vec::new();
        let header = self.node.header(&plan, mode, &sent_id, sent.now);
        let server_deadline = header.deadline;
        command(Some(&self.sha), &plan.keys, &plan.rules, &ext_refs(&plan), header).write_packed_command(&mut request);
        let (cached, sent_us, now, started) = (sent.cache.is_some(), sent.sent_us, sent.now, sent.started);
        let Plan { keys, rules: planned, ext, cost, lease, .. } = plan;
        let rules = planned.iter().map(|r| g.rules.locate(r)).collect();
        drop(planned);
        let flight = Flight {
            id,
            keys,
            rules,
            ext,
            cost,
            call_id: call_id.map(str::to_string),
            sent_id,
            lease,
            mode,
            cached,
            sent_us,
            now,
            started,
            deadline: Instant::now() + self.timeout,
            server_deadline,
            stage: Stage::First,
            left: 1,
            replies: SmallVec::new(),
            request,
            g: g.clone(),
        };
        self.send(Box::new(flight));
        None
    }

    /// Queue a call's current request (after the handshake on a new connection).
    fn send(&mut self, flight: Box<Flight>) {
        if !self.open {
            self.open = true;
            self.output.extend_from_slice(&self.handshake);
            if self.handshake_replies > 0 {
                let due = Instant::now() + self.timeout;
                self.slots.push_back(Slot::Handshake { left: self.handshake_replies, due });
            }
        }
        self.output.extend_from_slice(&flight.request);
        self.slots.push_back(Slot::Call(flight));
    }

    /// The bytes to write now (empty when there are none).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Bytes read from the socket: the calls they answer go to `done`.
    /// Returns `false` when the connection must be closed (a reply that is
    /// not Redis's protocol, or a refused handshake); its calls are settled
    /// then, and the next call connects anew.
    pub fn received(&mut self, bytes: &[u8], done: &mut WireOutcomes) -> bool {
        self.input.extend_from_slice(bytes);
        let mut at = 0;
        let keep = loop {
            let len = match frame_len(&self.input[at..]) {
                Ok(Some(len)) => len,
                Ok(None) => break true,
                Err(()) => {
                    let e = Error::new(ErrorKind::Backend, "redis sent a reply that is not in its protocol");
                    self.fail_all(|| e.clone(), done);
                    return false;
                }
            };
            let frame = &self.input[at..at + len];
            let value = match plain_value(frame).map(Ok).unwrap_or_else(|| redis::parse_redis_value(frame)) {
                Ok(v) => v,
                Err(e) => {
                    let e = Error::from(e);
                    self.fail_all(|| e.clone(), done);
                    return false;
                }
            };
            at += len;
            if !self.reply(value, done) {
                break false;
            }
        };
        if keep {
            self.input.drain(..at);
        } else {
            self.input.clear();
        }
        keep
    }

    /// One reply, for the slot at the front. `false` when the connection must close.
    fn reply(&mut self, value: Value, done: &mut WireOutcomes) -> bool {
        let Some(slot) = self.slots.front_mut() else {
            // A reply nobody asked for: the connection is out of step.
            let e = Error::new(ErrorKind::Backend, "redis sent a reply that no command asked for");
            self.fail_all(|| e.clone(), done);
            return false;
        };
        match slot {
            Slot::Handshake { left, .. } => {
                if let Err(e) = value.extract_error() {
                    let e = Error::from(e);
                    self.slots.pop_front();
                    self.fail_all(|| e.clone(), done);
                    return false;
                }
                *left -= 1;
                if *left == 0 {
                    self.slots.pop_front();
                }
            }
            Slot::Dropped { left, .. } => {
                *left -= 1;
                if *left == 0 {
                    self.slots.pop_front();
                }
            }
            Slot::Call(flight) => {
                flight.replies.push(value);
                flight.left -= 1;
                if flight.left == 0 {
                    let Some(Slot::Call(flight)) = self.slots.pop_front() else { unreachable!("the front slot is a call") };
                    self.answer(flight, done);
                }
            }
        }
        true
    }

    /// A call whose replies are all in: its decision, or its next stage after NOSCRIPT.
    fn answer(&mut self, mut flight: Box<Flight>, done: &mut WireOutcomes) {
        let mut replies = std::mem::take(&mut flight.replies).into_iter();
        let (first, second) = (replies.next(), replies.next());
        let reply = match (flight.stage, first, second) {
            (Stage::First, Some(v), _) => v.extract_error(),
            // The load's error is the call's; else the retry's reply.
            (Stage::Loaded, Some(load), Some(retry)) => load.extract_error().and_then(|_| retry.extract_error()),
            (Stage::Whole, Some(v), _) => v.extract_error(),
            _ => Err(redis::RedisError::from((redis::ErrorKind::Parse, "a reply is missing"))),
        };
        let next = match &reply {
            Err(e) if is_noscript(e) && flight.stage == Stage::First => Some(Stage::Loaded),
            // Flushed again between the load and the retry: the script itself cannot miss.
            Err(e) if is_noscript(e) && flight.stage == Stage::Loaded => Some(Stage::Whole),
            _ => None,
        };
        if let Some(stage) = next {
            flight.stage = stage;
            flight.request = self.request(&flight, stage);
            flight.left = if stage == Stage::Loaded { 2 } else { 1 };
            self.send(flight);
            return;
        }
        let ints = reply.and_then(|v| redis::from_redis_value::<Ints>(v).map(|r| r.0).map_err(redis::RedisError::from));
        let id = flight.id;
        done.push((id, self.settle(*flight, ints.map_err(Failure::Redis))));
    }

    /// The commands of `stage` for a call.
    fn request(&self, f: &Flight, stage: Stage) -> Vec<u8> {
        let rules = f.rules.iter().map(|&at| f.g.rules.located(at)).collect();
        let plan = Plan { keys: f.keys.clone(), rules, cost: f.cost, costs: None, call_id: f.call_id.as_deref(), ext: f.ext.clone(), lease: f.lease.clone() };
        let header = Header::of(&plan, f.mode, &f.sent_id, f.now)
            .until(f.server_deadline)
            .terse(f.now.is_some() || self.node.server_time().fresh());
        let ext = ext_refs(&plan);
        let mut out = Vec::new();
        match stage {
            Stage::First => command(Some(&self.sha), &plan.keys, &plan.rules, &ext, header).write_packed_command(&mut out),
            Stage::Loaded => {
                redis::cmd("SCRIPT").arg("LOAD").arg(CHECK_SCRIPT).write_packed_command(&mut out);
                command(Some(&self.sha), &plan.keys, &plan.rules, &ext, header).write_packed_command(&mut out);
            }
            Stage::Whole => command(None, &plan.keys, &plan.rules, &ext, header).write_packed_command(&mut out),
        }
        out
    }

    /// A call's decision from its reply (or its failure), through the limiter's one path.
    fn settle(&self, f: Flight, reply: std::result::Result<Vec<i64>, Failure>) -> Result<Decision> {
        let g = f.g;
        let rules = f.rules.iter().map(|&at| g.rules.located(at)).collect();
        let plan = Plan { keys: f.keys, rules, cost: f.cost, costs: None, call_id: f.call_id.as_deref(), ext: f.ext, lease: f.lease };
        let answer = match reply {
            Ok(v) => {
                self.node.server_time().observe_reply(&v, f.now);
                parse_check_reply(&v, &plan.rules, &ext_refs(&plan))
            }
            Err(Failure::Redis(e)) => {
                // A cost above an override's limit (lua/extensions.lua).
                let named = if plan.ext.is_empty() { None } else { override_error(&e, &plan.rules, plan.cost, None) };
                Err(named.unwrap_or_else(|| e.into()))
            }
            Err(Failure::Core(e)) => Err(e),
        };
        let cache = g.deny_cache.as_ref().filter(|_| f.cached);
        let sent = Sent { cache, sent_us: f.sent_us, now: f.now, started: f.started };
        self.limiter.after_send(&g, &plan, f.mode, sent, answer)
    }

    /// Settle every call still waiting with `error()`, and forget the connection.
    fn fail_all(&mut self, error: impl Fn() -> Error, done: &mut WireOutcomes) {
        for slot in std::mem::take(&mut self.slots) {
            if let Slot::Call(f) = slot {
                let id = f.id;
                done.push((id, self.settle(*f, Err(Failure::Core(error())))));
            }
        }
        self.input.clear();
        self.output.clear();
        self.open = false;
    }

    /// The time left until the next call's deadline (or until the oldest
    /// request makes the connection stale); `None` when nothing waits.
    pub fn next_deadline(&self) -> Option<Duration> {
        let calls = self.slots.iter().filter_map(|s| match s {
            Slot::Call(f) => Some(f.deadline),
            _ => None,
        });
        let stale = self.front_due().map(|due| due + STALE_AFTER);
        let next = calls.chain(stale).min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// When the reply at the front was due, if it belongs to no call waiting
    /// for it (the handshake, or a call that timed out).
    fn front_due(&self) -> Option<Instant> {
        match self.slots.front()? {
            Slot::Handshake { due, .. } | Slot::Dropped { due, .. } => Some(*due),
            Slot::Call(_) => None,
        }
    }

    /// Settle the calls past their deadline with the timeout error (their
    /// replies will be dropped). Returns `false` when the connection is
    /// stale (the reply at its front is [`STALE_AFTER`] overdue) and must be
    /// closed: then every call still on it gets the timeout error too.
    pub fn expire(&mut self, done: &mut WireOutcomes) -> bool {
        let now = Instant::now();
        let timeout = self.timeout;
        if self.front_due().is_some_and(|due| due + STALE_AFTER <= now) {
            self.fail_all(|| Error::timeout(timeout), done);
            return false;
        }
        for i in 0..self.slots.len() {
            let (left, due) = match &self.slots[i] {
                Slot::Call(f) if f.deadline <= now => (f.left, f.deadline),
                _ => continue,
            };
            let Slot::Call(f) = std::mem::replace(&mut self.slots[i], Slot::Dropped { left, due }) else { continue };
            let id = f.id;
            done.push((id, self.settle(*f, Err(Failure::Core(Error::timeout(timeout))))));
        }
        true
    }

    /// The connection could not be made: nothing written on it reached the
    /// server, so it is all written again on the next attempt
    /// ([`Wire::take_output`] after this, on a new socket). To give up
    /// instead, call [`Wire::lost`].
    pub fn connect_failed(&mut self) {
        let flights: Vec<Box<Flight>> = std::mem::take(&mut self.slots)
            .into_iter()
            .filter_map(|s| match s {
                Slot::Call(f) => Some(f),
                _ => None,
            })
            .collect();
        self.output.clear();
        self.open = false;
        for f in flights {
            self.send(f);
        }
    }

    /// The connection is gone (`error`, or the server closed it): the calls
    /// sent on it fail with that error (they may have been applied, so they
    /// are not sent again), and the next call connects anew.
    pub fn lost(&mut self, error: std::io::Error, done: &mut WireOutcomes) {
        let (kind, text) = (error.kind(), error.to_string());
        self.fail_all(|| Error::from(redis::RedisError::from(std::io::Error::new(kind, text.clone()))), done);
    }

    /// The limiter was closed: every call still waiting fails with `closed`.
    pub fn close(&mut self, done: &mut WireOutcomes) {
        self.fail_all(Error::closed, done);
    }
}

/// Why a call has no reply: Redis's error, or the core's (a timeout, a lost connection).
enum Failure {
    Redis(redis::RedisError),
    Core(Error),
}

/// The length of the first whole RESP2 reply in `buf`: `Ok(None)` while it
/// is incomplete, `Err` for bytes that are not a reply.
fn frame_len(buf: &[u8]) -> std::result::Result<Option<usize>, ()> {
    let mut at = 0;
    let mut need = 1usize;
    while need > 0 {
        let Some(end) = buf.get(at..).and_then(crlf) else { return Ok(None) };
        let (kind, line) = (buf[at], &buf[at + 1..at + end]);
        at += end + 2;
        need -= 1;
        let n = || std::str::from_utf8(line).ok().and_then(|s| s.parse::<i64>().ok()).ok_or(());
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let len = n()?;
                if len >= 0 {
                    at += len as usize + 2;
                    if at > buf.len() {
                        return Ok(None);
                    }
                }
            }
            b'*' => {
                let len = n()?;
                if len > 0 {
                    need += len as usize;
                }
            }
            _ => return Err(()),
        }
    }
    Ok(Some(at))
}

/// Where the first `\r\n` of `buf` starts.
fn crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    loop {
        let at = from + buf.get(from..)?.iter().position(|&b| b == b'\r')?;
        if buf.get(at + 1) == Some(&b'\n') {
            return Some(at);
        }
        from = at + 1;
    }
}

/// A whole reply (see [`frame_len`]) made only of simple strings, integers,
/// bulk strings and arrays (what a check's script returns), read as
/// `redis::parse_redis_value` reads it, without its general parser (which
/// allocates and clears 8 KiB per reply). `None` for anything else (an
/// error reply, another type, text that is not UTF-8 where a string is
/// expected, a bad number, deep nesting): the general parser reads those.
fn plain_value(frame: &[u8]) -> Option<Value> {
    let mut at = 0;
    let value = plain_at(frame, &mut at, 0)?;
    (at == frame.len()).then_some(value)
}

/// How deep [`plain_value`] follows nested arrays before it leaves the reply to the general parser.
const PLAIN_DEPTH: usize = 16;

fn plain_at(frame: &[u8], at: &mut usize, depth: usize) -> Option<Value> {
    let rest = frame.get(*at..)?;
    let end = crlf(rest)?;
    let (kind, line) = (*rest.first()?, rest.get(1..end)?);
    *at += end + 2;
    let number = || std::str::from_utf8(line).ok()?.trim().parse::<i64>().ok();
    Some(match kind {
        b'+' => match std::str::from_utf8(line).ok()? {
            "OK" => Value::Okay,
            text => Value::SimpleString(text.to_string()),
        },
        b':' => Value::Int(number()?),
        b'$' => {
            let Ok(len) = usize::try_from(number()?) else { return Some(Value::Nil) };
            let bytes = frame.get(*at..at.checked_add(len)?)?;
            if frame.get(*at + len..*at + len + 2)? != b"\r\n" {
                return None;
            }
            *at += len + 2;
            Value::BulkString(bytes.to_vec())
        }
        b'*' if depth < PLAIN_DEPTH => {
            let Ok(len) = usize::try_from(number()?) else { return Some(Value::Nil) };
            let mut items = Vec::with_capacity(len.min(frame.len()));
            for _ in 0..len {
                items.push(plain_at(frame, at, depth + 1)?);
            }
            Value::Array(items)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::{crlf, frame_len, plain_value};

    #[test]
    fn crlf_is_the_first_line_end() {
        assert_eq!(crlf(b"ab\r\ncd\r\n"), Some(2));
        assert_eq!(crlf(b"a\rb\r\n"), Some(3));
        assert_eq!(crlf(b"\r\r\n"), Some(1));
        assert_eq!(crlf(b"abc\r"), None);
        assert_eq!(crlf(b""), None);
    }

    #[test]
    fn plain_replies_read_as_the_general_parser_reads_them() {
        let replies: &[&[u8]] = &[
            b"*6\r\n:1796280503104959\r\n:0\r\n:1\r\n:999\r\n:-5\r\n$3\r\nabc\r\n",
            b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+OK\r\n$-1\r\n",
            b"+OK\r\n",
            b"+PONG\r\n",
            b"$0\r\n\r\n",
            b"$4\r\na\r\nb\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b":  42 \r\n",
            b"*2\r\n*1\r\n*1\r\n:3\r\n$2\r\n\xc3\xa9\r\n",
        ];
        for reply in replies {
            let general = redis::parse_redis_value(reply).unwrap();
            assert_eq!(plain_value(reply), Some(general), "{}", String::from_utf8_lossy(reply));
        }
        // left to the general parser
        for reply in [
            &b"-NOSCRIPT No matching script\r\n"[..],
            b"*2\r\n:1\r\n-ERR x\r\n",
            b":x\r\n",
            b"+\xff\r\n",
            b"%1\r\n+a\r\n:1\r\n",
            b"$3\r\nabcd\r\n",
            b"*2\r\n:1\r\n",
        ] {
            assert_eq!(plain_value(reply), None, "{}", String::from_utf8_lossy(reply));
        }
        let deep = format!("{}:1\r\n", "*1\r\n".repeat(40));
        assert_eq!(plain_value(deep.as_bytes()), None);
    }

    #[test]
    fn frames_are_whole_replies() {
        let reply = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+OK\r\n$-1\r\n";
        for cut in 0..reply.len() {
            assert_eq!(frame_len(&reply[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(frame_len(reply), Ok(Some(reply.len())));
        let two = b"-NOSCRIPT No matching script\r\n:7\r\n";
        assert_eq!(frame_len(two), Ok(Some(30)));
        assert_eq!(frame_len(b"*0\r\n"), Ok(Some(4)));
        assert_eq!(frame_len(b"?x\r\n"), Err(()));
        assert_eq!(frame_len(b"$x\r\n"), Err(()));
    }
}
