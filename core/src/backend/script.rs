//! The check script: its text, the arguments a plan sends, and its reply.

use crate::algo::Outcome;
use super::Outcomes;
use crate::error::{Error, ErrorKind, Result};
use std::fmt::Write as _;

use crate::plan::{BlockArgs, CompiledRule, Mode, Plan, PlanExt, RuleArgs};

/// The one script behind every check: the deadline test, the single-rule fast paths, the
/// arguments of the general one, every algorithm, the replay and give-back helpers and the stacked
/// driver from `lua/`, composed at build time. `#!lua` (Redis >= 7)
/// makes Redis refuse the whole script up front when it is out of memory,
/// instead of failing half-way through the writes.
pub const CHECK_SCRIPT: &str = concat!(
    "#!lua\n",
    include_str!("../../lua/deadline.lua"),
    "\n",
    include_str!("../../lua/single_rule.lua"),
    "\n",
    include_str!("../../lua/args.lua"),
    "\n",
    include_str!("../../lua/sliding_window_log.lua"),
    "\n",
    include_str!("../../lua/token_bucket.lua"),
    "\n",
    include_str!("../../lua/sliding_window.lua"),
    "\n",
    include_str!("../../lua/period_counter.lua"),
    "\n",
    include_str!("../../lua/concurrency.lua"),
    "\n",
    include_str!("../../lua/replay.lua"),
    "\n",
    include_str!("../../lua/extensions.lua"),
    "\n",
    include_str!("../../lua/settle.lua"),
    "\n",
    include_str!("../../lua/reserve.lua"),
    "\n",
    include_str!("../../lua/check.lua"),
);

/// Run a script call by its SHA, and, when the server no longer has the
/// script (a flush, a restart), once more with the whole script, which
/// cannot miss. `build(Some(sha))` makes the EVALSHA, `build(None)` the EVAL.
pub(crate) async fn query_script<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    sha: &str,
    build: impl Fn(Option<&str>) -> redis::Cmd,
) -> crate::error::Result<Vec<i64>> {
    match build(Some(sha)).query_async(conn).await {
        Ok(v) => Ok(v),
        Err(e) if is_noscript(&e) => Ok(build(None).query_async(conn).await?),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `EVALSHA` of the check script with `sha`, or `EVAL` of the whole script
/// when `sha` is `None`: the start of every command that runs it.
fn script_cmd(sha: Option<&str>) -> redis::Cmd {
    match sha {
        Some(sha) => {
            let mut c = redis::cmd("EVALSHA");
            c.arg(sha);
            c
        }
        None => {
            let mut c = redis::cmd("EVAL");
            c.arg(CHECK_SCRIPT);
            c
        }
    }
}

/// A command (`EVALSHA` with `sha`, or `EVAL` of the whole script when
/// `sha` is `None`) for these keys and rules of a plan.
pub(crate) fn command<K: redis::ToRedisArgs>(
    sha: Option<&str>,
    keys: &[K],
    rules: &[&CompiledRule],
    ext: &[PlanExt<&str>],
    header: Header<'_>,
) -> redis::Cmd {
    let mut cmd = script_cmd(sha);
    if !ext.is_empty() {
        return extended(cmd, keys, rules, ext, header);
    }
    cmd.arg(keys.len()).arg(keys);
    header.deadline_args(&mut cmd);
    // The most common check has a short form of its own (lua/single_rule.lua):
    // call id, limit, window and, on a clock other than the server's, the time.
    if let ([rule], "c", 1, None) = (rules, header.mode, header.cost, header.costs) {
        if let RuleArgs::Window { shadow: false, .. } = rule.args {
            cmd.arg(if header.terse { "t" } else { "s" }).arg(header.call_id).arg(&rule.script_args[1..]);
            if let Some(t) = header.now {
                cmd.arg(t);
            }
            return cmd;
        }
    }
    // So has a check of stacked logs at cost 1 whose admission comes back
    // terse (mode "n"): call id, the time or "", each rule's limit and window.
    if let ("c", 1, None, true) = (header.mode, header.cost, header.costs, header.terse) {
        if stacked_logs_fit(rules) {
            cmd.arg("n").arg(header.call_id);
            match header.now {
                Some(t) => cmd.arg(t),
                None => cmd.arg(""),
            };
            for rule in rules {
                cmd.arg(&rule.script_args[1..]);
            }
            return cmd;
        }
    }
    // So has a check of one fixed window, at any cost: limit, window, cost and
    // the time (mode "f"); it needs no call id.
    if let ([rule], "c", None) = (rules, header.mode, header.costs) {
        if let RuleArgs::Fixed { shadow: false, limit, window_us } = rule.args {
            let terse = header.terse && fixed_fits(limit, window_us);
            cmd.arg(if terse { "i" } else { "f" }).arg(&rule.script_args[1..]).arg(header.cost);
            if let Some(t) = header.now {
                cmd.arg(t);
            }
            return cmd;
        }
    }
    cmd.arg(header.mode);
    match header.now {
        Some(t) => cmd.arg(t),
        None => cmd.arg(""),
    };
    cmd.arg(header.call_id);
    header.cost_arg(&mut cmd);
    for rule in rules {
        cmd.arg(&rule.script_args[..]);
    }
    cmd
}

/// The general form with the overrides and blocks of `ext` (lua/extensions.lua):
/// their keys after the rules' keys, one more argument after the rules'.
fn extended<K: redis::ToRedisArgs>(
    mut cmd: redis::Cmd,
    keys: &[K],
    rules: &[&CompiledRule],
    ext: &[PlanExt<&str>],
    header: Header<'_>,
) -> redis::Cmd {
    let extra = ext.iter().map(|e| e.override_key.is_some() as usize + e.block_key.is_some() as usize).sum::<usize>();
    cmd.arg(keys.len() + extra).arg(keys);
    let mut spec = String::new();
    let mut next = keys.len();
    for e in ext {
        let mut index = |k: Option<&str>| match k {
            Some(_) => {
                next += 1;
                next
            }
            None => 0,
        };
        let okey = index(e.override_key);
        let bkey = index(e.block_key);
        if !spec.is_empty() {
            spec.push(';');
        }
        let b = e.ext.block.unwrap_or(BlockArgs { duration_us: 0, factor: 1.0, max_us: 0, period_us: 0 });
        let _ = write!(
            spec,
            "{},{okey},{bkey},{},{},{},{}",
            e.at + 1,
            b.duration_us,
            b.factor,
            b.max_us,
            b.period_us
        );
        for k in [e.override_key, e.block_key].into_iter().flatten() {
            cmd.arg(k);
        }
    }
    header.deadline_args(&mut cmd);
    cmd.arg(header.mode);
    match header.now {
        Some(t) => cmd.arg(t),
        None => cmd.arg(""),
    };
    cmd.arg(header.call_id);
    header.cost_arg(&mut cmd);
    for rule in rules {
        cmd.arg(&rule.script_args[..]);
    }
    cmd.arg(spec);
    cmd
}

/// What every invocation of a plan says before its rules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header<'a> {
    /// `c` check, `C` check that looks its call id up first, `p` peek, `u` give back.
    pub mode: &'static str,
    /// The time in microseconds, or `None` for the server's clock.
    pub now: Option<i64>,
    pub call_id: &'a str,
    /// The cost (the largest, when `costs` is set).
    pub cost: u64,
    /// Each rule's own cost, when they differ or one is 0 (sent as `<c1>,<c2>,...,`).
    pub costs: Option<&'a [u64]>,
    /// A check's deadline on the server's clock (microseconds): the script
    /// changes nothing when it starts later (`lua/deadline.lua`).
    pub deadline: Option<i64>,
    /// The one-rule log check may answer an admission with its bare
    /// `remaining` (mode `t`, `lua/single_rule.lua`): set when the reply
    /// need not carry the server's time (see [`super::ServerTime::fresh`]).
    pub terse: bool,
}

impl<'a> Header<'a> {
    /// The header of a plan sent to one Redis node. A caller's own call id
    /// may come back in a retry: `C` looks it up first.
    pub fn of(plan: &'a Plan<'_, String>, mode: Mode, call_id: &'a str, now: Option<i64>) -> Header<'a> {
        let mode = match mode {
            Mode::Check if plan.call_id.is_some() => "C",
            Mode::Check => "c",
            Mode::Peek => "p",
        };
        Header { mode, now, call_id, cost: plan.cost, costs: plan.costs.as_deref(), deadline: None, terse: false }
    }

    /// The cost argument (ARGV[4], `lua/args.lua`): the cost, or one per rule.
    fn cost_arg(&self, cmd: &mut redis::Cmd) {
        match self.costs {
            Some(costs) => {
                let mut list = String::with_capacity(costs.len() * 3);
                for c in costs {
                    let _ = write!(list, "{c},");
                }
                cmd.arg(list)
            }
            None => cmd.arg(self.cost),
        };
    }

    /// This header with `terse` set (see [`Header::terse`]).
    pub fn terse(self, terse: bool) -> Header<'a> {
        Header { terse, ..self }
    }

    /// This header with a deadline (server clock, microseconds), kept only
    /// by a check: a peek writes nothing, and a give-back must run whenever
    /// it arrives.
    pub fn until(self, deadline: Option<i64>) -> Header<'a> {
        let deadline = if matches!(self.mode, "c" | "C") { deadline } else { None };
        Header { deadline, ..self }
    }

    /// The deadline's two arguments (`lua/deadline.lua`) before the call's own.
    fn deadline_args(&self, cmd: &mut redis::Cmd) {
        if let Some(d) = self.deadline {
            cmd.arg("!").arg(d);
        }
    }
}

/// A settle (mode `x`, `lua/settle.lua`) of the check `call_id` of cost
/// `estimate` to `actual`, for these keys and rules: `EVALSHA` with `sha`, or
/// `EVAL` of the whole script when `sha` is `None`.
pub(crate) fn settle_command<K: redis::ToRedisArgs>(
    sha: Option<&str>,
    keys: &[K],
    rules: &[&CompiledRule],
    now: Option<i64>,
    call_id: &str,
    estimate: u64,
    actual: u64,
) -> redis::Cmd {
    let mut cmd = script_cmd(sha);
    cmd.arg(keys.len()).arg(keys).arg("x");
    match now {
        Some(t) => cmd.arg(t),
        None => cmd.arg(""),
    };
    cmd.arg(call_id).arg(format!("{estimate}:{actual}"));
    for rule in rules {
        cmd.arg(&rule.script_args[..]);
    }
    cmd
}

/// A release (mode `d`) or an extend by `extend_us` (mode `e`) of lease
/// `lease_id` on these keys of concurrency rules (`lua/concurrency.lua`):
/// `EVALSHA` with `sha`, or `EVAL` of the whole script when `sha` is `None`.
/// Its reply reads as a settle's: per key, whether the lease held slots there.
pub(crate) fn lease_command<K: redis::ToRedisArgs>(
    sha: Option<&str>,
    keys: &[K],
    rules: &[&CompiledRule],
    now: Option<i64>,
    lease_id: &str,
    extend_us: Option<i64>,
) -> redis::Cmd {
    let mut cmd = script_cmd(sha);
    cmd.arg(keys.len()).arg(keys).arg(if extend_us.is_some() { "e" } else { "d" });
    match now {
        Some(t) => cmd.arg(t),
        None => cmd.arg(""),
    };
    cmd.arg(lease_id).arg(extend_us.unwrap_or(0));
    for rule in rules {
        cmd.arg(&rule.script_args[..]);
    }
    cmd
}

/// Which of `n` rules a settle's reply says were settled.
pub(crate) fn parse_settle_reply(reply: &[i64], n: usize) -> Result<super::Settled> {
    if reply.len() != 2 + n {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "the settle script returned {} values for {n} rules; is another version of throttlegate's script loaded under the same hash?",
                reply.len()
            ),
        ));
    }
    Ok(reply[2..]
        .iter()
        .map(|&v| match v {
            1 => super::SettleOutcome::Settled,
            -1 => super::SettleOutcome::PushedOut,
            _ => super::SettleOutcome::Unchanged,
        })
        .collect())
}

/// True for the reply of a check that reached Redis after its deadline and
/// changed nothing (`lua/deadline.lua`): `{ server time, -1 }`.
pub(crate) fn is_expired(reply: &[i64]) -> bool {
    reply.len() == 2 && reply[1] == -1
}

/// A check script's reply: its integers, or the bare integer of a terse
/// admission (mode `t`) as a list of one.
pub(crate) struct Ints(pub Vec<i64>);

impl redis::FromRedisValue for Ints {
    fn from_redis_value_ref(v: &redis::Value) -> std::result::Result<Ints, redis::ParsingError> {
        match v {
            redis::Value::Int(n) => Ok(Ints(vec![*n])),
            v => Vec::<i64>::from_redis_value_ref(v).map(Ints),
        }
    }

    fn from_redis_value(v: redis::Value) -> std::result::Result<Ints, redis::ParsingError> {
        match v {
            redis::Value::Int(n) => Ok(Ints(vec![n])),
            v => Vec::<i64>::from_redis_value(v).map(Ints),
        }
    }
}

/// Whether a fixed window's terse admission (mode `i`, `lua/single_rule.lua`),
/// `reset_after_us * (limit + 1) + remaining` with `reset_after_us <= window_us`,
/// stays below 2^53, exact in a Lua number.
fn fixed_fits(limit: u64, window_us: i64) -> bool {
    (window_us.max(0) as u128 + 1) * (limit as u128 + 1) < 1 << 53
}

/// Whether `rules` can be checked in mode `n` (`lua/single_rule.lua`): two
/// or more sliding-window logs, none in shadow mode, whose terse admission,
/// every rule's `remaining` in one integer (rule i's digit in base
/// `limit_i + 1`), stays below 2^53, exact in a Lua number.
fn stacked_logs_fit(rules: &[&CompiledRule]) -> bool {
    if rules.len() < 2 {
        return false;
    }
    let mut product: u128 = 1;
    for rule in rules {
        match rule.args {
            RuleArgs::Window { limit, shadow: false, .. } => {
                product = product.saturating_mul(limit as u128 + 1);
                if product >= 1 << 53 {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

/// The outcomes of a check's reply for `rules`: a terse admission (one
/// integer: a log's `remaining` in mode `t`, a fixed window's
/// `reset_after_us * (limit + 1) + remaining` in mode `i`) or the full
/// reply ([`parse_reply`]).
pub(crate) fn parse_check_reply(reply: &[i64], rules: &[&CompiledRule], ext: &[PlanExt<&str>]) -> Result<Outcomes> {
    if let ([v], [rule], []) = (reply, rules, ext) {
        let (remaining, reset_after_us) = match rule.args {
            RuleArgs::Window { window_us, .. } => ((*v).max(0) as u64, window_us),
            RuleArgs::Fixed { limit, .. } if *v >= 0 => {
                let (v, base) = (*v as u64, limit + 1);
                (v % base, (v / base) as i64)
            }
            _ => return parse_reply(reply, rules.len(), ext),
        };
        return Ok(smallvec::smallvec![Outcome {
            allowed: true,
            remaining,
            retry_after_us: 0,
            reset_after_us,
            limit: 0,
            blocked: false,
        }]);
    }
    // Mode "n": stacked logs, every rule's remaining in one integer.
    if let ([v], []) = (reply, ext) {
        if rules.len() >= 2 && *v >= 0 {
            let mut left = *v as u64;
            let mut outcomes = Outcomes::new();
            for rule in rules {
                let RuleArgs::Window { limit, window_us, .. } = rule.args else {
                    return parse_reply(reply, rules.len(), ext);
                };
                outcomes.push(Outcome {
                    allowed: true,
                    remaining: left % (limit + 1),
                    retry_after_us: 0,
                    reset_after_us: window_us,
                    limit: 0,
                    blocked: false,
                });
                left /= limit + 1;
            }
            return Ok(outcomes);
        }
    }
    parse_reply(reply, rules.len(), ext)
}

/// The per-rule outcomes of a reply for `n` rules, with the overrides and
/// blocks of `ext` (positions in those rules) read from its tail.
pub(crate) fn parse_reply(reply: &[i64], n: usize, ext: &[PlanExt<&str>]) -> Result<Outcomes> {
    if is_expired(reply) {
        return Err(Error::expired());
    }
    if reply.len() != 2 + 4 * n + 2 * ext.len() {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "the check script returned {} values for {n} rules; is another version of throttlegate's script loaded under the same hash?",
                reply.len()
            ),
        ));
    }
    let mut outcomes: Outcomes = reply[2..2 + 4 * n]
        .chunks_exact(4)
        .map(|c| Outcome {
            allowed: c[0] == 1,
            remaining: c[1].max(0) as u64,
            retry_after_us: c[2],
            reset_after_us: c[3],
            limit: 0,
            blocked: false,
        })
        .collect();
    for (e, tail) in ext.iter().zip(reply[2 + 4 * n..].chunks_exact(2)) {
        outcomes[e.at].limit = tail[0].max(0) as u64;
        outcomes[e.at].blocked = tail[1] == 1;
    }
    Ok(outcomes)
}

/// The plan's overrides and blocks with borrowed keys.
pub(crate) fn ext_refs<'a>(plan: &'a Plan<'_, String>) -> smallvec::SmallVec<[PlanExt<&'a str>; 2]> {
    plan.ext
        .iter()
        .map(|e| PlanExt {
            at: e.at,
            ext: e.ext,
            override_key: e.override_key.as_deref(),
            block_key: e.block_key.as_deref(),
        })
        .collect()
}

/// The error a reply names when a cost is above an override's limit
/// (`lua/extensions.lua`), in the words of the same check made before the script.
/// `costs` are the rules' own costs, when they differ (else every rule's is `cost`).
pub(crate) fn override_error(e: &redis::RedisError, rules: &[&CompiledRule], cost: u64, costs: Option<&[u64]>) -> Option<Error> {
    let text = e.to_string();
    let at = text.find("throttlegate: cost above override ")?;
    let mut words = text[at + "throttlegate: cost above override ".len()..].split_whitespace();
    let i: usize = words.next()?.parse().ok()?;
    let limit: u64 = words.next()?.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()?;
    let rule = rules.get(i.checked_sub(1)?)?;
    let cost = costs.and_then(|c| c.get(i - 1).copied()).unwrap_or(cost);
    Some(cost_above(&rule.name, cost, limit))
}

/// The error of a cost above the limit that applies (a rule's, a tier's or an override's).
pub(crate) fn cost_above(rule: &str, cost: u64, limit: u64) -> Error {
    Error::invalid_argument(format!(
        "cost: {cost} is more than rule {rule:?} allows ({limit}); such a request could never pass"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Rules;
    use crate::policy::{Policy, Rule};
    use std::time::Duration;

    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_window_rule_at_cost_1_takes_the_short_form_with_or_without_a_time() {
        let policy = Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 5, Duration::from_secs(1))]).unwrap();
        let rules = Rules::compile(&policy, None);
        let plan = rules.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let server = command(Some("sha"), &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Check, "id", None));
        assert_eq!(args(&server)[4..], ["s", "id", "5", "1000000"]);
        // A manual or system clock (every conformance vector): the same short form, with the time.
        let manual = command(Some("sha"), &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Check, "id", Some(42)));
        assert_eq!(args(&manual)[4..], ["s", "id", "5", "1000000", "42"]);
        // Anything else takes the general form.
        let peek = command(None, &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Peek, "id", Some(42)));
        assert_eq!(args(&peek)[4..], ["p", "42", "id", "1", "w", "5", "1000000"]);
        let with_id = rules.plan(&[("ip", "a")], 1, Some("mine"), str::to_string).unwrap();
        let c = command(None, &with_id.keys, &with_id.rules, &[], Header::of(&with_id, Mode::Check, "mine", None));
        assert_eq!(args(&c)[4..], ["C", "", "mine", "1", "w", "5", "1000000"]);
    }

    #[test]
    fn stacked_logs_with_a_terse_header_take_mode_n_and_its_integer_holds_every_remaining() {
        let window = Duration::from_secs(1);
        let policy = Policy::new(vec![
            Rule::sliding_window_log("a", "ip:{ip}", 5, window),
            Rule::sliding_window_log("b", "route:{ip}", 1000, Duration::from_secs(60)),
        ])
        .unwrap();
        let rules = Rules::compile(&policy, None);
        let plan = rules.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let terse = Header::of(&plan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &plan.keys, &plan.rules, &[], terse))[5..], ["n", "id", "", "5", "1000000", "1000", "60000000"]);
        let timed = Header::of(&plan, Mode::Check, "id", Some(42)).terse(true);
        assert_eq!(args(&command(Some("sha"), &plan.keys, &plan.rules, &[], timed))[5..], ["n", "id", "42", "5", "1000000", "1000", "60000000"]);
        // Without terse (the server's time is wanted back), at cost 2, or as a peek: the general form.
        let full = Header::of(&plan, Mode::Check, "id", None);
        assert_eq!(args(&command(Some("sha"), &plan.keys, &plan.rules, &[], full))[5], "c");
        let two = rules.plan(&[("ip", "a")], 2, None, str::to_string).unwrap();
        assert_eq!(args(&command(Some("sha"), &two.keys, &two.rules, &[], Header::of(&two, Mode::Check, "id", None).terse(true)))[5], "c");
        let peek = Header::of(&plan, Mode::Peek, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &plan.keys, &plan.rules, &[], peek))[5], "p");
        // remaining_a + 6 * remaining_b.
        let o = parse_check_reply(&[3 + 6 * 998], &plan.rules, &[]).unwrap();
        let got: Vec<_> = o.iter().map(|o| (o.allowed, o.remaining, o.retry_after_us, o.reset_after_us)).collect();
        assert_eq!(got, [(true, 3, 0, 1_000_000), (true, 998, 0, 60_000_000)]);
        // A denial comes in the general form.
        let o = parse_check_reply(&[7, 0, 1, 4, 0, 1_000_000, 0, 0, 250, 900], &plan.rules, &[]).unwrap();
        assert_eq!((o[0].allowed, o[1].allowed, o[1].retry_after_us), (true, false, 250));
        // Limits whose product passes 2^53, a shadow rule or another algorithm: the general form.
        let big = Policy::new(vec![
            Rule::sliding_window_log("a", "ip:{ip}", 1 << 27, window),
            Rule::sliding_window_log("b", "route:{ip}", 1 << 27, window),
        ])
        .unwrap();
        let big = Rules::compile(&big, None);
        let bplan = big.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let h = Header::of(&bplan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &bplan.keys, &bplan.rules, &[], h))[5], "c");
        let mixed = Policy::new(vec![
            Rule::sliding_window_log("a", "ip:{ip}", 5, window),
            Rule::token_bucket("b", "route:{ip}", 5, 1.0),
        ])
        .unwrap();
        let mixed = Rules::compile(&mixed, None);
        let mplan = mixed.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let h = Header::of(&mplan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &mplan.keys, &mplan.rules, &[], h))[5], "c");
    }

    #[test]
    fn a_terse_header_takes_mode_t_and_its_bare_reply_is_an_admission() {
        let policy = Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 5, Duration::from_secs(1))]).unwrap();
        let rules = Rules::compile(&policy, None);
        let plan = rules.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let header = Header::of(&plan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &plan.keys, &plan.rules, &[], header))[4..], ["t", "id", "5", "1000000"]);
        // The bare integer: admitted, its remaining, reset after the window.
        let o = parse_check_reply(&[3], &plan.rules, &[]).unwrap();
        assert_eq!((o[0].allowed, o[0].remaining, o[0].retry_after_us, o[0].reset_after_us), (true, 3, 0, 1_000_000));
        // A denial (or any reply of the general form) is read as before.
        let o = parse_check_reply(&[7, 0, 0, 0, 250, 900], &plan.rules, &[]).unwrap();
        assert_eq!((o[0].allowed, o[0].remaining, o[0].retry_after_us, o[0].reset_after_us), (false, 0, 250, 900));
        // A fixed window's: reset_after * (limit + 1) + remaining (mode "i").
        let fixed = Policy::new(vec![Rule::fixed_window("f", "ip:{ip}", 5, Duration::from_secs(1))]).unwrap();
        let fixed = Rules::compile(&fixed, None);
        let fplan = fixed.plan(&[("ip", "a")], 2, None, str::to_string).unwrap();
        let header = Header::of(&fplan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &fplan.keys, &fplan.rules, &[], header))[4..], ["i", "5", "1000000", "2"]);
        let o = parse_check_reply(&[400_000 * 6 + 3], &fplan.rules, &[]).unwrap();
        assert_eq!((o[0].allowed, o[0].remaining, o[0].retry_after_us, o[0].reset_after_us), (true, 3, 0, 400_000));
        // A window and limit whose terse reply could pass 2^53 keep mode "f".
        let wide = Policy::new(vec![Rule::fixed_window("f", "ip:{ip}", 1_000_000_000, Duration::from_secs(86_400))]).unwrap();
        let wide = Rules::compile(&wide, None);
        let wplan = wide.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        let header = Header::of(&wplan, Mode::Check, "id", None).terse(true);
        assert_eq!(args(&command(Some("sha"), &wplan.keys, &wplan.rules, &[], header))[4], "f");
        // One integer is not a reply for another algorithm.
        let bucket = Policy::new(vec![Rule::token_bucket("b", "ip:{ip}", 5, 1.0)]).unwrap();
        let bucket = Rules::compile(&bucket, None);
        let bplan = bucket.plan(&[("ip", "a")], 1, None, str::to_string).unwrap();
        assert!(parse_check_reply(&[3], &bplan.rules, &[]).is_err());
        // A terse admission carries no server time: nothing is learned from it.
        let time = super::super::ServerTime::default();
        time.observe_reply(&[3], None);
        assert!(!time.fresh());
        time.observe_reply(&[crate::clock::system_now_us(), 0, 1, 3, 0, 1_000_000], None);
        assert!(time.fresh());
    }

    #[test]
    fn one_fixed_window_rule_takes_its_short_form_at_any_cost() {
        let policy = Policy::new(vec![Rule::fixed_window("f", "ip:{ip}", 5, Duration::from_secs(1))]).unwrap();
        let rules = Rules::compile(&policy, None);
        let plan = rules.plan(&[("ip", "a")], 3, None, str::to_string).unwrap();
        let server = command(Some("sha"), &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Check, "id", None));
        assert_eq!(args(&server)[4..], ["f", "5", "1000000", "3"]);
        let manual = command(Some("sha"), &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Check, "id", Some(42)));
        assert_eq!(args(&manual)[4..], ["f", "5", "1000000", "3", "42"]);
        let peek = command(None, &plan.keys, &plan.rules, &[], Header::of(&plan, Mode::Peek, "id", Some(42)));
        assert_eq!(args(&peek)[4..], ["p", "42", "id", "3", "f", "5", "1000000"]);
    }
}
