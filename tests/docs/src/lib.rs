//! The Rust examples of the documentation site, as doc tests: `cargo test -p
//! throttlegate-docs --doc` compiles every ```rust block of these pages and runs
//! those not marked `no_run`. tests/docs/run_examples.py fails when a page with
//! Rust blocks is missing here.

#[cfg(doctest)]
#[doc = include_str!("../../../docs/getting-started/rust.md")]
pub struct GettingStartedRust;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/concepts/settle.md")]
pub struct ConceptsSettle;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/concepts/concurrency.md")]
pub struct ConceptsConcurrency;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/operating/reload-lint-diff.md")]
pub struct OperatingReload;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/operating/overrides.md")]
pub struct OperatingOverrides;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/operating/metrics.md")]
pub struct OperatingMetrics;

#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct Readme;
