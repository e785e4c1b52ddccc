//! # throttlegate-server
//!
//! throttlegate as a service: Envoy's rate limit service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, gRPC) and
//! an HTTP API (`POST /json` as envoyproxy/ratelimit, `POST /v1/check`,
//! `GET /healthcheck`, `GET /metrics`, `GET /rules`), over the core's
//! [`Limiter`]. The rules are a native policy or envoyproxy/ratelimit's
//! YAML ([`rules`]). Run by `throttlegate serve`.
//!
//! The server converts requests and answers, as a binding does: every
//! descriptor of one request is checked in one stacked, all-or-nothing call
//! of the core, and the counting, the stacking, the failure policy and the
//! headers are the core's.
#![deny(missing_docs)]

pub mod grpc;
pub mod http;
pub mod rls;
pub mod rules;
pub mod service;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use throttlegate::{Error, ErrorKind, Limiter, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::rules::Rules;
use crate::service::State;

/// The default gRPC address (envoyproxy/ratelimit's).
pub const DEFAULT_GRPC: &str = "0.0.0.0:8081";
/// The default HTTP address (envoyproxy/ratelimit's).
pub const DEFAULT_HTTP: &str = "0.0.0.0:8080";
/// How long a shutdown waits for calls in flight before it stops anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How to run a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// The rules: a native policy (`.toml`, `.json`), an envoyproxy/ratelimit
    /// YAML file, or a directory of YAML files.
    pub rules: PathBuf,
    /// The backend (`redis://`, `rediss://`, `redis+cluster://`...); `None`: the embedded one.
    pub url: Option<String>,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    /// Add `RateLimit`, `RateLimit-Policy` and `Retry-After` to the RLS answers' `response_headers_to_add`.
    pub response_headers: bool,
    /// Bound on each backend call (the policy's `timeout` when `None`; 100 ms for YAML rules).
    pub timeout: Option<Duration>,
    /// What a backend failure answers (the policy's `on_backend_error` when `None`; `allow` for YAML rules).
    pub on_backend_error: Option<throttlegate::FailureMode>,
    /// Reload when the rules file (or a YAML file of the directory) changes, besides SIGHUP.
    pub watch: bool,
}

/// One structured log line on stderr: a JSON object with `ts` (Unix
/// seconds), `level`, `event`, and the event's fields.
pub fn log(level: &str, event: &str, fields: Value) {
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let mut line = json!({ "ts": (ts * 1000.0).round() / 1000.0, "level": level, "event": event });
    if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// A running server's shared parts.
pub struct Server {
    /// The limiter and the rules in force.
    pub state: Arc<State>,
    stopping: AtomicBool,
}

impl Server {
    /// A server over `state`.
    pub fn new(state: Arc<State>) -> Server {
        Server { state, stopping: AtomicBool::new(false) }
    }

    /// Whether a shutdown has begun (the health check fails from then on).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// The server's own metric families (OpenMetrics text, without `# EOF`):
    /// RLS requests per domain.
    pub fn metrics_text(&self) -> String {
        let (domains, others) = self.state.domain_counts();
        let mut out = String::from(
            "# TYPE throttlegate_server_requests counter\n# HELP throttlegate_server_requests Rate limit service requests, per domain.\n",
        );
        for (d, n) in &domains {
            let d = d.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            out.push_str(&format!("throttlegate_server_requests_total{{domain=\"{d}\"}} {n}\n"));
        }
        if others > 0 {
            out.push_str(&format!("throttlegate_server_requests_other_total {others}\n"));
        }
        out
    }
}

/// Build the limiter for `config` and read its rules.
pub fn build(config: &Config) -> Result<Arc<State>> {
    let rules = Rules::load(&config.rules)?;
    // The core reports each outage once, when calls start failing and when one succeeds again.
    let mut b = Limiter::builder(rules.policy.clone()).on_health(throttlegate::HealthSink::new(|event| match event {
        throttlegate::HealthEvent::Down { cause, error } => {
            log("error", "backend_error", json!({ "cause": cause.as_str(), "error": error.to_string() }))
        }
        throttlegate::HealthEvent::Up { cause, down_for, failed_calls } => log(
            "info",
            "backend_recovered",
            json!({ "cause": cause.as_str(), "down_seconds": down_for.as_secs_f64(), "failed_calls": failed_calls }),
        ),
        _ => {}
    }));
    if let Some(url) = &config.url {
        b = b.url(url.clone());
    }
    if let Some(t) = config.timeout {
        b = b.timeout(t);
    }
    if let Some(m) = config.on_backend_error {
        b = b.on_backend_error(m);
    }
    let limiter = b.build()?;
    Ok(Arc::new(State::new(limiter, rules, config.rules.clone(), config.response_headers)))
}

/// A fingerprint of the rules' files (modification time and size of each),
/// to notice a change.
fn fingerprint(path: &std::path::Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    let mut out = Vec::new();
    let mut add = |p: PathBuf| {
        let m = std::fs::metadata(&p).ok();
        out.push((p, m.as_ref().and_then(|m| m.modified().ok()), m.map_or(0, |m| m.len())));
    };
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            add(f);
        }
    } else {
        add(path.to_path_buf());
    }
    out
}

fn reload(server: &Server, why: &str) {
    match server.state.reload() {
        Ok(diff) => {
            let rules = server.state.rules();
            log(
                "info",
                "reload",
                json!({ "trigger": why, "rules": rules.policy.rules().len(), "domains": rules.domains.len(), "changed_rules": diff.rules.iter().filter(|r| r.kind != throttlegate::RuleChangeKind::Unchanged).count() }),
            );
        }
        Err(e) => log("error", "reload_refused", json!({ "trigger": why, "error": e.to_string() })),
    }
}

/// Serve until SIGTERM or SIGINT: gRPC on `config.grpc`, HTTP on
/// `config.http`. Reloads on SIGHUP (and on a file change with `watch`).
/// A shutdown stops accepting, lets calls in flight finish (at most
/// [`SHUTDOWN_GRACE`]) and closes the backend.
pub async fn run(config: Config) -> Result<()> {
    let state = build(&config)?;
    let grpc = TcpListener::bind(config.grpc)
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot listen on --grpc {}: {e}", config.grpc)))?;
    let http = TcpListener::bind(config.http)
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot listen on --http {}: {e}", config.http)))?;
    let grpc_addr = grpc.local_addr().map_err(|e| Error::new(ErrorKind::Io, e.to_string()))?;
    let http_addr = http.local_addr().map_err(|e| Error::new(ErrorKind::Io, e.to_string()))?;
    let server = Arc::new(Server::new(state.clone()));
    // Installed before the start line, so a signal sent once it is read is handled.
    let signals = Signals::install();
    let rules = state.rules();
    log(
        "info",
        "start",
        json!({
            "version": throttlegate::VERSION,
            "grpc": grpc_addr.to_string(),
            "http": http_addr.to_string(),
            "backend": state.limiter.backend_name(),
            "rules": config.rules.display().to_string(),
            "format": match rules.format { rules::Format::Native => "native", rules::Format::Envoy => "envoy" },
            "rule_count": rules.policy.rules().len(),
            "domains": rules.domains.len(),
        }),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let grpc_task = {
        let svc = grpc::RateLimitService::new(server.clone());
        let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
        let rx = stop_rx.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, stopped(rx))
                .await
        })
    };
    let http_task = {
        let app = http::router(server.clone());
        let rx = stop_rx.clone();
        tokio::spawn(async move { axum::serve(http, app).with_graceful_shutdown(stopped(rx)).await })
    };
    if config.watch {
        let server = server.clone();
        let path = config.rules.clone();
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            let mut seen = fingerprint(&path);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(throttlegate::RELOAD_POLL_INTERVAL) => {}
                    _ = rx.wait_for(|s| *s) => return,
                }
                let now = fingerprint(&path);
                if now != seen {
                    seen = now;
                    reload(&server, "file_change");
                }
            }
        });
    }

    signals.wait(&server).await;
    server.stopping.store(true, Ordering::Relaxed);
    log("info", "shutdown", json!({ "grace_seconds": SHUTDOWN_GRACE.as_secs() }));
    let _ = stop_tx.send(true);
    let finish = async {
        let g = grpc_task.await;
        let h = http_task.await;
        (g, h)
    };
    let clean = tokio::time::timeout(SHUTDOWN_GRACE, finish).await.is_ok();
    state.limiter.close();
    log("info", "stopped", json!({ "clean": clean }));
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP, listened to from the start.
struct Signals {
    #[cfg(unix)]
    streams: Option<[tokio::signal::unix::Signal; 3]>,
}

impl Signals {
    fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let streams = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup())) {
                (Ok(t), Ok(i), Ok(h)) => Some([t, i, h]),
                _ => {
                    log("error", "signals", json!({ "error": "cannot install signal handlers" }));
                    None
                }
            };
            Signals { streams }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Until SIGTERM or SIGINT; SIGHUP reloads the rules meanwhile.
    async fn wait(self, server: &Server) {
        #[cfg(unix)]
        if let Some([mut term, mut int, mut hup]) = self.streams {
            loop {
                tokio::select! {
                    _ = term.recv() => return,
                    _ = int.recv() => return,
                    _ = hup.recv() => reload(server, "sighup"),
                }
            }
        }
        let _ = server;
        let _ = tokio::signal::ctrl_c().await;
    }
}
