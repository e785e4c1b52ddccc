//! [`Limiter::reload`]: a new policy swapped in whole, and the optional
//! watch of the policy file (`reload_on_change`).
//!
//! A reload compiles the new policy, then replaces the one in force with
//! one atomic pointer swap (`arc-swap`): a check loads the policy once when
//! it starts and finishes on it, so checks in flight end on the old policy
//! and the next ones use the new one. Which rules keep their state is
//! [`PolicyDiff::between`]'s answer, the same as `throttlegate diff`'s.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use super::{Generation, Inner, Limiter};
use crate::diff::{PolicyDiff, RuleChangeKind};
use crate::error::{Error, Result};
use crate::plan::Rules;
use crate::policy::{FailureMode, Policy};
use crate::runtime;

/// How often `reload_on_change` looks at the policy file's modification
/// time, size and inode (one `stat` call).
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The limiter's own settings that a reloaded policy gets as the first did.
pub(super) struct Overrides {
    pub prefix: Option<String>,
    pub on_backend_error: Option<FailureMode>,
    pub key_secret: Option<Vec<u8>>,
    /// The watched file, with `reload_on_change`.
    pub watching: Option<PathBuf>,
    /// Rules added from code ([`Limiter::add_route_limit`]): every policy
    /// put in force gets them after its own.
    pub added: Mutex<Vec<crate::policy::Rule>>,
}

/// Reloads applied and refused, and the last refusal.
#[derive(Default)]
pub(super) struct ReloadCounters {
    applied: AtomicU64,
    refused: AtomicU64,
    last_error: Mutex<Option<Error>>,
    /// One reload at a time (a call and the watcher may race).
    pub(super) serial: Mutex<()>,
}

/// How reloads went: see [`Limiter::reload_status`].
#[derive(Debug, Clone)]
pub struct ReloadStatus {
    /// Policies applied ([`Limiter::reload`] and the file watch).
    pub reloads: u64,
    /// Reloads refused: a policy that did not parse or validate, a file
    /// that could not be read, or a policy a reload cannot apply (see
    /// [`PolicyDiff::check`]). The policy in force stayed.
    pub errors: u64,
    /// The last refusal's error (kept until the next one).
    pub last_error: Option<Error>,
    /// The file watched with `reload_on_change`, if any.
    pub watching: Option<PathBuf>,
}

impl Limiter {
    /// Put `policy` in force, atomically: checks already started finish on
    /// the old policy, every later one uses the new one. A rule that keeps
    /// its name, its key and its algorithm (and the prefix is unchanged)
    /// keeps its state, whatever else of it changed; the others start
    /// afresh (see [`PolicyDiff`]). The limiter's own settings (`prefix`,
    /// `on_backend_error`, `key_secret`) apply to the new policy as they did
    /// to the first; the call timeout stays the limiter's.
    ///
    /// Refused, with the old policy still in force, when the limiter is
    /// closed, or with [`crate::ErrorKind::InvalidPolicy`] when a rule keeps
    /// its name and key but changes its algorithm (rename it). A policy
    /// that does not parse never gets here: its parser refuses it
    /// ([`Limiter::reload_file`] counts that too). Per-rule metrics go on
    /// for the rules that keep their name; a removed rule is no longer
    /// exposed. Remembered denials are kept only for the rules whose every
    /// field is unchanged. Returns what changed.
    pub fn reload(&self, policy: Policy) -> Result<PolicyDiff> {
        let answer = self.apply(policy);
        self.record(answer)
    }

    /// Read `path` ([`Policy::from_file`]) and [`Limiter::reload`] it; a
    /// file that cannot be read or parsed is refused (and counted) the same way.
    pub fn reload_file(&self, path: impl AsRef<Path>) -> Result<PolicyDiff> {
        let answer = Policy::from_file(path).and_then(|p| self.apply(p));
        self.record(answer)
    }

    /// Reloads applied and refused, the last refusal's error, and the
    /// watched file. A refused background reload (`reload_on_change`) is
    /// reported here and in the metrics
    /// (`throttlegate_policy_reload_errors_total`); nothing is printed.
    pub fn reload_status(&self) -> ReloadStatus {
        let r = &self.inner.reloads;
        ReloadStatus {
            reloads: r.applied.load(Ordering::Relaxed),
            errors: r.refused.load(Ordering::Relaxed),
            last_error: r.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            watching: self.inner.overrides.watching.clone(),
        }
    }

    fn record(&self, answer: Result<PolicyDiff>) -> Result<PolicyDiff> {
        let r = &self.inner.reloads;
        match &answer {
            Ok(_) => {
                r.applied.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                r.refused.fetch_add(1, Ordering::Relaxed);
                *r.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
            }
        }
        answer
    }

    fn apply(&self, policy: Policy) -> Result<PolicyDiff> {
        self.ensure_open()?;
        let _one = self.inner.reloads.serial.lock().unwrap_or_else(|p| p.into_inner());
        let added = self.inner.overrides.added.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.put_in_force(policy.with_rules_added(&added)?)
    }

    /// Put `policy` (rules added included) in force; the caller holds the reload lock.
    pub(super) fn put_in_force(&self, policy: Policy) -> Result<PolicyDiff> {
        let old = self.inner.current.load_full();
        let o = &self.inner.overrides;
        let mut policy = policy.with_timeout(old.policy.timeout)?;
        if let Some(p) = &o.prefix {
            policy = policy.with_prefix(p.clone())?;
        }
        if let Some(m) = o.on_backend_error {
            policy = policy.with_on_backend_error(m);
        }
        let diff = PolicyDiff::between(&old.policy, &policy);
        diff.check(&old.policy, &policy)?;
        let rules = Rules::compile(&policy, o.key_secret.as_deref());
        let metrics = old.metrics.as_ref().map(|m| m.carried(rules.names()).with_reserved(rules.reserved()));
        let deny_cache = old.deny_cache.as_ref().map(|c| {
            c.carried(|name| {
                diff.rules
                    .iter()
                    .find(|r| r.name == name && r.kind == RuleChangeKind::Unchanged)
                    .and_then(|r| r.new_index)
            })
        });
        self.inner.current.store(Arc::new(Generation { policy, rules, metrics, deny_cache }));
        Ok(diff)
    }
}

/// What tells a file's new version from the last one seen.
#[derive(PartialEq)]
struct Seen {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn seen(path: &Path) -> std::io::Result<Seen> {
    let m = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(Seen { modified: m.modified().ok(), len: m.len(), inode })
}

/// Watch `path` for the limiter: every [`RELOAD_POLL_INTERVAL`], on the
/// core's runtime, compare the file's modification time, size and inode
/// with the last seen, and reload it when they changed. Ends when the
/// limiter is closed or dropped. A forked child does not watch.
pub(super) fn watch(inner: Weak<Inner>, path: PathBuf) -> Result<()> {
    let mut last = seen(&path).ok();
    runtime::runtime()?.spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = inner.upgrade() else { break };
            let limiter = Limiter { inner };
            if limiter.is_closed() {
                break;
            }
            let now = seen(&path);
            match now {
                Ok(now) if last.as_ref() == Some(&now) => {}
                Ok(now) => {
                    last = Some(now);
                    let _ = limiter.reload_file(&path);
                }
                // Gone or unreadable: reported once, until it changes again.
                Err(e) if last.is_some() => {
                    last = None;
                    let err = Error::new(crate::ErrorKind::Io, format!("cannot read policy file {}", path.display()))
                        .with_source(e);
                    let _ = limiter.record(Err(err));
                }
                Err(_) => {}
            }
        }
    });
    Ok(())
}
