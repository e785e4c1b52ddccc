//! Redis Cluster: rules grouped by hash slot, one script invocation per slot.
//!
//! Rules whose keys share a slot (a policy can co-locate them on purpose with
//! a `{{hash tag}}` in their key templates) are decided together in one
//! invocation, all or nothing. Different slots are decided concurrently; when
//! one of them denies, the slots that admitted give back what they consumed
//! (undo mode of the script). Meanwhile another request may briefly see less
//! quota than it could have had, but no limit is ever exceeded.
//!
//! Every cluster call carries a call id that the script checks first, so a
//! script the cluster client re-sends (after a redirection or a lost
//! connection) cannot count twice. When one slot recognises the call id and
//! another does not (its key was reset since), the call is a re-send on
//! every slot: the other slot gives back and is peeked at cost 0.

use std::time::Duration;

use futures_util::future::join_all;
use smallvec::SmallVec;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::redis::TlsOptions;
use super::script::{command, ext_refs, is_noscript, lease_command, override_error, query_script, parse_reply, parse_settle_reply, settle_command, Header, CHECK_SCRIPT};
use super::{Outcomes, ServerTime};
use crate::plan::{CompiledRule, Mode, Plan, PlanExt};
use crate::error::{Error, Result};

/// CRC16/XMODEM, the hash of Redis Cluster slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The hash slot of `key`, honouring `{hash tags}` as Redis does.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % 16384
}

/// Parse `redis+cluster://host:port,host:port/` (or `rediss+cluster://` for
/// TLS) into one seed URL per node.
pub(crate) fn seed_urls(url: &str) -> Result<Vec<String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return Err(Error::invalid_argument(format!("url: {url:?} is not a cluster URL")));
    };
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    let seeds: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{auth}{h}"))
        .collect();
    if seeds.is_empty() {
        return Err(Error::invalid_argument(format!(
            "url: {url:?} names no node; write redis+cluster://host:port,host:port"
        )));
    }
    Ok(seeds)
}

/// A Redis Cluster backend. Clones share the connection.
#[derive(Clone)]
pub(crate) struct ClusterBackend(std::sync::Arc<ClusterInner>);

pub(crate) struct ClusterInner {
    client: ClusterClient,
    conn: tokio::sync::OnceCell<ClusterConnection>,
    sha: String,
    timeout: Duration,
    /// The servers' clock, for each check's deadline (one estimate for the
    /// cluster's nodes, which keep their clocks in step).
    time: ServerTime,
}

impl ClusterBackend {
    pub fn new(url: &str, timeout: Duration, tls: Option<&TlsOptions>) -> Result<ClusterBackend> {
        let seeds = seed_urls(url)?;
        // The cluster client retries many times and has no overall bound by
        // default: bound every attempt by the timeout and retry only twice,
        // quickly; the limiter's own timeout bounds the whole call anyway.
        let mut builder = ClusterClient::builder(seeds)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .min_retry_wait(5)
            .max_retry_wait(50);
        if let Some(t) = tls {
            t.validate()?;
            builder = builder.certs(t.certificates());
        }
        let client = builder
            .build()
            .map_err(|e| Error::invalid_argument(format!("url: {url:?}: {e}")).with_source(e))?;
        Ok(ClusterBackend(std::sync::Arc::new(ClusterInner {
            client,
            conn: tokio::sync::OnceCell::new(),
            sha: redis::Script::new(CHECK_SCRIPT).get_hash().to_string(),
            timeout,
            time: ServerTime::default(),
        })))
    }

    async fn conn(&self) -> Result<ClusterConnection> {
        let c = self
            .0
            .conn
            .get_or_try_init(|| async { self.0.client.get_async_connection().await })
            .await?;
        Ok(c.clone())
    }

    /// One invocation for the rules `idx` of the plan (all in one slot): their
    /// outcomes, and whether the slot recognised the call id as a re-send.
    async fn eval_group(
        &self,
        mut conn: ClusterConnection,
        plan: &Plan<'_, String>,
        idx: &[usize],
        header: Header<'_>,
    ) -> Result<(Outcomes, bool)> {
        let keys: SmallVec<[&str; 4]> = idx.iter().map(|&i| plan.keys[i].as_str()).collect();
        // The rules' own costs, when they differ within this slot (a peek at
        // cost 0, a re-send's, takes none).
        let costs: Option<SmallVec<[u64; 4]>> = plan
            .costs
            .as_ref()
            .filter(|_| header.cost > 0)
            .map(|cs| idx.iter().map(|&i| cs[i]).collect());
        let header = match &costs {
            Some(cs) if cs.iter().all(|&c| c == cs[0] && c > 0) => Header { cost: cs[0], costs: None, ..header },
            Some(cs) => Header { cost: cs.iter().copied().max().unwrap_or(0), costs: Some(cs), ..header },
            None => header,
        };
        let rules: SmallVec<[&CompiledRule; 4]> = idx.iter().map(|&i| plan.rules[i]).collect();
        // The overrides and blocks of these rules, at their places in the group
        // (they live in the slot of their rule's key).
        let ext: SmallVec<[PlanExt<&str>; 2]> = ext_refs(plan)
            .into_iter()
            .filter_map(|e| idx.iter().position(|&i| i == e.at).map(|at| PlanExt { at, ..e }))
            .collect();
        let reply: Vec<i64> = match command(Some(&self.0.sha), &keys, &rules, &ext, header).query_async(&mut conn).await {
            Ok(v) => v,
            Err(e) if is_noscript(&e) => {
                // EVAL runs (and caches) the script on the node that owns the
                // slot; the call id keeps it from counting twice.
                match command(None, &keys, &rules, &ext, header).query_async(&mut conn).await {
                    Ok(v) => v,
                    Err(e) => return Err(override_error(&e, &rules, header.cost, header.costs).unwrap_or_else(|| e.into())),
                }
            }
            Err(e) => return Err(override_error(&e, &rules, header.cost, header.costs).unwrap_or_else(|| e.into())),
        };
        if header.mode == "u" {
            return Ok((SmallVec::new(), false));
        }
        self.0.time.observe_reply(&reply, header.now);
        let replayed = reply.get(1) == Some(&1);
        Ok((parse_reply(&reply, idx.len(), &ext)?, replayed))
    }

    /// Decide the plan slot by slot; give back on a denial.
    pub async fn eval(&self, plan: &Plan<'_, String>, call_id: &str, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        // The call's deadline counts from its start, connecting included.
        let deadline = now.is_none().then(|| self.0.time.deadline(self.0.timeout));
        let conn = self.conn().await?;
        let groups = slot_groups(&plan.keys);
        // Every cluster check may be re-sent after a redirection or a
        // failover, so its call id is always looked up first ("C").
        let m = if mode == Mode::Check { "C" } else { "p" };
        let header = Header { mode: m, now, call_id, cost: plan.cost, costs: None, deadline: None, terse: false }.until(deadline);
        let mut results = join_all(
            groups
                .iter()
                .map(|(_, idx)| self.eval_group(conn.clone(), plan, idx, header)),
        )
        .await;
        let replay = mode == Mode::Check && results.iter().any(|r| matches!(r, Ok((_, true))));
        if replay {
            // A slot recognised the call id: the call is a re-send, answered
            // as a peek at cost 0 everywhere (as one Redis node answers it).
            // A slot that did not (its key was reset, or its id forgotten)
            // gives back what it has just recorded and is peeked instead.
            let redo = join_all(groups.iter().zip(&results).map(|((_, idx), r)| {
                let conn = conn.clone();
                async move {
                    match r {
                        Ok((_, true)) | Err(_) => None,
                        Ok((os, false)) => {
                            let passed = idx.iter().zip(os).all(|(&i, o)| o.allowed || plan.rules[i].args.shadow());
                            let took: Vec<usize> = idx.iter().zip(os).filter(|(&i, o)| passed && o.allowed && plan.cost_at(i) > 0).map(|(&i, _)| i).collect();
                            if !took.is_empty() {
                                if let Err(e) = self.eval_group(conn.clone(), plan, &took, Header { mode: "u", deadline: None, ..header }).await {
                                    return Some(Err(e));
                                }
                            }
                            let peek = Header { mode: "p", cost: 0, deadline: None, ..header };
                            Some(self.eval_group(conn, plan, idx, peek).await.map(|(os, _)| (os, true)))
                        }
                    }
                }
            }))
            .await;
            for (r, again) in results.iter_mut().zip(redo) {
                if let Some(again) = again {
                    *r = again;
                }
            }
            // Nothing was recorded: nothing to give back, whatever the answers.
            let mut outcomes = vec![None; plan.keys.len()];
            for ((_, idx), r) in groups.iter().zip(results) {
                for (&i, o) in idx.iter().zip(r?.0) {
                    outcomes[i] = Some(o);
                }
            }
            return Ok(outcomes.into_iter().map(|o| o.expect("every group answered")).collect());
        }
        let mut outcomes = vec![None; plan.keys.len()];
        let mut first_err = None;
        let mut committed: Vec<&Vec<usize>> = Vec::new();
        let mut all_pass = true;
        for ((_, idx), r) in groups.iter().zip(results) {
            match r {
                Ok((os, _)) => {
                    let group_pass = idx
                        .iter()
                        .zip(&os)
                        .all(|(&i, o)| o.allowed || plan.rules[i].args.shadow());
                    all_pass &= group_pass;
                    if group_pass {
                        committed.push(idx);
                    }
                    for (&i, o) in idx.iter().zip(os) {
                        outcomes[i] = Some(o);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if mode == Mode::Check && (!all_pass || first_err.is_some()) {
            // Give back what the admitting slots consumed (only the rules
            // that admitted were written).
            let undo: Vec<Vec<usize>> = committed
                .iter()
                .map(|idx| {
                    idx.iter()
                        .copied()
                        .filter(|&i| plan.cost_at(i) > 0 && outcomes[i].map(|o| o.allowed).unwrap_or(false))
                        .collect::<Vec<_>>()
                })
                .filter(|v| !v.is_empty())
                .collect();
            let undone = join_all(
                undo.iter()
                    .map(|idx| self.eval_group(conn.clone(), plan, idx, Header { mode: "u", deadline: None, ..header })),
            )
            .await;
            if let Some(e) = undone.into_iter().find_map(|r| r.err()) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if !all_pass {
            // The slots that admitted gave back (or, peeking, took nothing):
            // their rules have what they had, without the cost.
            for &i in committed.iter().flat_map(|idx| idx.iter()) {
                if let Some(o) = outcomes[i].as_mut().filter(|o| o.allowed) {
                    o.remaining += plan.cost_at(i);
                }
            }
        }
        Ok(outcomes.into_iter().map(|o| o.expect("every group answered")).collect())
    }

    /// Run one command (routed by its key).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn().await?;
        Ok(cmd.query_async(&mut conn).await?)
        }

    /// Settle the check `call_id` of `plan` to `actual`, slot by slot
    /// (concurrently): which rules were settled. Each slot's settle is
    /// atomic and marks the call settled there, so a settle re-sent after a
    /// redirection or a failure counts once.
    pub async fn settle(
        &self,
        plan: &Plan<'_, String>,
        call_id: &str,
        actual: u64,
        now: Option<i64>,
    ) -> Result<super::Settled> {
        let conn = self.conn().await?;
        let groups = slot_groups(&plan.keys);
        let results = join_all(groups.iter().map(|(_, idx)| {
            let mut conn = conn.clone();
            async move {
                let keys: SmallVec<[&str; 4]> = idx.iter().map(|&i| plan.keys[i].as_str()).collect();
                let rules: SmallVec<[&CompiledRule; 4]> = idx.iter().map(|&i| plan.rules[i]).collect();
                let build = |sha: Option<&str>| settle_command(sha, &keys, &rules, now, call_id, plan.cost, actual);
                let reply = query_script(&mut conn, &self.0.sha, build).await?;
                parse_settle_reply(&reply, idx.len())
            }
        }))
        .await;
        let mut settled: super::Settled = SmallVec::from_elem(super::SettleOutcome::Unchanged, plan.keys.len());
        for ((_, idx), r) in groups.iter().zip(results) {
            for (&i, done) in idx.iter().zip(r?) {
                settled[i] = done;
            }
        }
        Ok(settled)
    }

    /// Release or extend lease `lease_id` on these keys of concurrency
    /// rules, slot by slot (concurrently): per key, whether the lease held
    /// slots there. Both are idempotent, so a re-send cannot count twice.
    pub async fn lease(
        &self,
        keys: &[String],
        rules: &[&CompiledRule],
        lease_id: &str,
        extend_us: Option<i64>,
        now: Option<i64>,
    ) -> Result<SmallVec<[bool; 4]>> {
        let conn = self.conn().await?;
        let groups = slot_groups(keys);
        let results = join_all(groups.iter().map(|(_, idx)| {
            let mut conn = conn.clone();
            async move {
                let ks: SmallVec<[&str; 4]> = idx.iter().map(|&i| keys[i].as_str()).collect();
                let rs: SmallVec<[&CompiledRule; 4]> = idx.iter().map(|&i| rules[i]).collect();
                let build = |sha: Option<&str>| lease_command(sha, &ks, &rs, now, lease_id, extend_us);
                let reply = query_script(&mut conn, &self.0.sha, build).await?;
                parse_settle_reply(&reply, idx.len())
            }
        }))
        .await;
        let mut done: SmallVec<[bool; 4]> = SmallVec::from_elem(false, keys.len());
        for ((_, idx), r) in groups.iter().zip(results) {
            for (&i, d) in idx.iter().zip(r?) {
                done[i] = d == super::SettleOutcome::Settled;
            }
        }
        Ok(done)
    }

    /// Delete `keys` (one command per key: they may live on different nodes).
    pub async fn reset(&self, keys: &[String]) -> Result<u64> {
        let conn = self.conn().await?;
        let results = join_all(keys.iter().map(|k| {
            let mut c = conn.clone();
            async move { redis::cmd("DEL").arg(k).query_async::<u64>(&mut c).await }
        }))
        .await;
        let mut n = 0;
        for r in results {
            n += r?;
        }
        Ok(n)
    }

    /// Round trip to the cluster.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(())
    }
}

/// The plan's keys by Cluster slot, in order of first appearance: each
/// slot and the positions of its keys.
fn slot_groups(keys: &[String]) -> Vec<(u16, Vec<usize>)> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let s = slot(key);
        match groups.iter_mut().find(|(g, _)| *g == s) {
            Some((_, v)) => v.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot("foo{{bar}}zap"), crc16(b"{bar") % 16384);
    }

    #[test]
    fn seed_urls_parse() {
        assert_eq!(
            seed_urls("redis+cluster://a:1,b:2/").unwrap(),
            vec!["redis://a:1", "redis://b:2"]
        );
        assert_eq!(
            seed_urls("rediss+cluster://u:p@a:1,b:2").unwrap(),
            vec!["rediss://u:p@a:1", "rediss://u:p@b:2"]
        );
        assert!(seed_urls("redis+cluster://").is_err());
    }
}
