//! A decision as a run of numbers, for front ends that move decisions in
//! bulk across a language boundary (Node's `Float64Array`s): the headline
//! figures can be read straight from the numbers, and [`rebuild`] gives back
//! the core's own decision, field for field (every duration travels in
//! microseconds), when the per-rule results, headers or problem body are
//! asked for. Rules travel as their policy index ([`RuleResult::index`]).
//!
//! Layout:
//!
//! | offset | headline |
//! |---|---|
//! | 0 | number of rule results `n` |
//! | 1 | flags: 1 allowed, 2 degraded |
//! | 2, 3 | limit, remaining |
//! | 4, 5 | retry-after and reset-after in milliseconds, rounded up |
//! | 6 | index of the headline rule in the policy, -1 for none |
//! | 7, 8 | retry-after and reset-after in microseconds |
//!
//! then `n` times 7 numbers: rule index, flags (1 allowed, 2 shadow), limit,
//! remaining, retry-after, reset-after and window in microseconds.

use std::time::Duration;

use crate::decision::{ceil_millis, Decision, RuleName, RuleResult};
use crate::error::Error;

/// Numbers before the per-rule results.
pub const HEAD: usize = 9;
/// Numbers per rule result.
pub const PER_RULE: usize = 7;

/// Numbers this decision takes.
pub fn len(d: &Decision) -> usize {
    HEAD + PER_RULE * d.results.len()
}

fn us(d: Duration) -> f64 {
    // Through u64: a u128 conversion is a slow library call.
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX) as f64
}

/// Write `d` at the start of `out`, which holds at least [`len`]`(d)` numbers.
pub fn write(out: &mut [f64], d: &Decision) {
    let flags = u8::from(d.allowed) | (u8::from(d.degraded) << 1);
    let head = [
        d.results.len() as f64,
        f64::from(flags),
        d.limit as f64,
        d.remaining as f64,
        ceil_millis(d.retry_after) as f64,
        ceil_millis(d.reset_after) as f64,
        d.headline().map_or(-1.0, |r| r.index as f64),
        us(d.retry_after),
        us(d.reset_after),
    ];
    out[..HEAD].copy_from_slice(&head);
    for (chunk, r) in out[HEAD..].chunks_exact_mut(PER_RULE).zip(&d.results) {
        let flags = u8::from(r.allowed) | (u8::from(r.shadow) << 1);
        chunk.copy_from_slice(&[
            r.index as f64,
            f64::from(flags),
            r.limit as f64,
            r.remaining as f64,
            us(r.retry_after),
            us(r.reset_after),
            us(r.window),
        ]);
    }
}

/// The records of many calls' outcomes, one after the other in call order,
/// a failed call as the single number -1; and the failures with their
/// positions among the calls.
pub fn write_all(outcomes: Vec<Result<Decision, Error>>) -> (Vec<f64>, Vec<(usize, Error)>) {
    let size = outcomes.iter().map(|o| o.as_ref().map_or(1, len)).sum();
    let mut records = vec![0.0; size];
    let mut errors = Vec::new();
    let mut at = 0;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(d) => {
                let n = len(&d);
                write(&mut records[at..at + n], &d);
                at += n;
            }
            Err(e) => {
                records[at] = -1.0;
                at += 1;
                errors.push((i, e));
            }
        }
    }
    (records, errors)
}

fn bad(what: &str) -> Error {
    Error::internal(format_args!("malformed decision record ({what})"))
}

fn count(x: f64, what: &str) -> Result<u64, Error> {
    if x.is_finite() && x >= 0.0 && x.fract() == 0.0 {
        Ok(x as u64)
    } else {
        Err(bad(what))
    }
}

fn micros(x: f64, what: &str) -> Result<Duration, Error> {
    count(x, what).map(Duration::from_micros)
}

fn rule(names: &[RuleName], x: f64) -> Result<(usize, RuleName), Error> {
    let i = count(x, "rule index")? as usize;
    names.get(i).map(|&n| (i, n)).ok_or_else(|| bad("rule index"))
}

/// The decision written by [`write`] at the start of `rec`, for a policy
/// whose rule names are `names` ([`crate::Limiter::rule_names`]).
pub fn rebuild(rec: &[f64], names: &[RuleName]) -> Result<Decision, Error> {
    let head = rec.get(..HEAD).ok_or_else(|| bad("too short"))?;
    let n = count(head[0], "result count")? as usize;
    if n > names.len() {
        return Err(bad("result count"));
    }
    let rules = rec
        .get(HEAD..HEAD + n * PER_RULE)
        .ok_or_else(|| bad("too short"))?;
    let flags = count(head[1], "flags")?;
    let results: crate::decision::RuleResults = rules
        .chunks_exact(PER_RULE)
        .map(|r| {
            let flags = count(r[1], "rule flags")?;
            let (index, rule) = rule(names, r[0])?;
            Ok(RuleResult {
                rule,
                index,
                allowed: flags & 1 != 0,
                shadow: flags & 2 != 0,
                limit: count(r[2], "limit")?,
                remaining: count(r[3], "remaining")?,
                retry_after: micros(r[4], "retry-after")?,
                reset_after: micros(r[5], "reset-after")?,
                window: micros(r[6], "window")?,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(Decision {
        allowed: flags & 1 != 0,
        limit: count(head[2], "limit")?,
        remaining: count(head[3], "remaining")?,
        retry_after: micros(head[7], "retry-after")?,
        reset_after: micros(head[8], "reset-after")?,
        rule: if head[6] < 0.0 {
            None
        } else {
            Some(rule(names, head[6])?.1)
        },
        results,
        degraded: flags & 2 != 0,
        settle: None,
        lease: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn names() -> Vec<RuleName> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    fn rule(name: &str, allowed: bool, shadow: bool, remaining: u64, retry_us: u64) -> RuleResult {
        RuleResult {
            rule: name.into(),
            index: names().iter().position(|n| *n == name).unwrap(),
            allowed,
            shadow,
            limit: 10,
            remaining,
            retry_after: Duration::from_micros(retry_us),
            reset_after: Duration::from_micros(59_999_001),
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn decisions_survive_the_round_trip_exactly() {
        let names = names();
        let cases = vec![
            Decision::from_results(vec![rule("a", true, false, 3, 0)], false),
            Decision::from_results(
                vec![
                    rule("a", true, false, 3, 0),
                    rule("c", false, false, 0, 1_500_001),
                ],
                false,
            ),
            Decision::from_results(vec![rule("b", false, true, 0, 7)], true),
            Decision::unlimited(),
        ];
        for d in cases {
            let mut buf = vec![f64::NAN; len(&d) + 3];
            write(&mut buf, &d);
            assert_eq!(rebuild(&buf, &names).unwrap(), d);
        }
    }

    #[test]
    fn headline_figures_are_in_milliseconds_rounded_up() {
        let d = Decision::from_results(vec![rule("b", false, false, 0, 1_500_001)], false);
        let mut buf = vec![0.0; len(&d)];
        write(&mut buf, &d);
        assert_eq!(
            &buf[..HEAD],
            &[
                1.0,
                0.0,
                10.0,
                0.0,
                1501.0,
                60_000.0,
                1.0,
                1_500_001.0,
                59_999_001.0
            ]
        );
    }

    #[test]
    fn many_outcomes_go_one_after_the_other() {
        let ok = Decision::from_results(vec![rule("a", true, false, 3, 0)], false);
        let (records, errors) = write_all(vec![Ok(ok.clone()), Err(Error::closed()), Ok(Decision::unlimited())]);
        assert_eq!(records.len(), len(&ok) + 1 + HEAD);
        assert_eq!(rebuild(&records, &names()).unwrap(), ok);
        assert_eq!(records[len(&ok)], -1.0);
        assert_eq!(rebuild(&records[len(&ok) + 1..], &names()).unwrap(), Decision::unlimited());
        assert_eq!(errors.len(), 1);
        assert_eq!((errors[0].0, errors[0].1.kind()), (1, ErrorKind::Closed));
    }

    #[test]
    fn malformed_records_are_internal_errors() {
        let names = names();
        for rec in [
            vec![],
            vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            vec![9.0; HEAD],
            vec![0.0, 1.0, -1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0],
            vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0],
            vec![0.0, 1.0, 1.5, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0],
        ] {
            let err = rebuild(&rec, &names).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Internal, "{rec:?}");
        }
    }
}
