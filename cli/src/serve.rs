//! `throttlegate serve`: Envoy's rate limit service and the HTTP check API
//! (the `throttlegate-server` crate).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::error::{CliError, CliResult};

pub const AFTER_HELP: &str = "\
Serves envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on --grpc and, on --http:
POST /json (envoyproxy/ratelimit's), POST /v1/check ({\"attributes\": {...}, \"cost\": n}),
GET /healthcheck, GET /metrics, GET /rules.

--rules is a native policy (.toml, .json), an envoyproxy/ratelimit YAML file (.yaml, .yml),
or a directory of YAML files (one domain each). SIGHUP reloads it (so does a change of the
file, unless --no-watch); a file that does not validate is refused and the rules in force
stay. SIGTERM stops accepting, finishes the calls in flight and closes the backend.
Log lines (start, reload, backend error, shutdown) are JSON objects on stderr.

Examples:
  throttlegate serve --rules examples/serve/ratelimit.yaml
  THROTTLEGATE_URL=redis://127.0.0.1:6379 throttlegate serve --rules /etc/ratelimit/config";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Rules: a native policy, an envoyproxy/ratelimit YAML file, or a directory of them.
    #[arg(long, value_name = "PATH", env = "THROTTLEGATE_RULES")]
    pub rules: PathBuf,
    /// Backend URL (redis://, rediss://, redis+cluster://...); omitted: the embedded backend.
    #[arg(long, value_name = "URL", env = "THROTTLEGATE_URL")]
    pub url: Option<String>,
    /// gRPC address (the rate limit service).
    #[arg(long, value_name = "ADDR", env = "THROTTLEGATE_GRPC", default_value = throttlegate_server::DEFAULT_GRPC)]
    pub grpc: SocketAddr,
    /// HTTP address (/json, /v1/check, /healthcheck, /metrics, /rules).
    #[arg(long, value_name = "ADDR", env = "THROTTLEGATE_HTTP", default_value = throttlegate_server::DEFAULT_HTTP)]
    pub http: SocketAddr,
    /// Bound on each backend call (e.g. 100ms); default: the policy's (100ms for YAML rules).
    #[arg(long, value_name = "DURATION", env = "THROTTLEGATE_TIMEOUT", value_parser = crate::parse_duration_arg)]
    pub timeout: Option<std::time::Duration>,
    /// What a backend failure answers: allow (OK), deny (OVER_LIMIT) or error (gRPC UNAVAILABLE);
    /// default: the policy's on_backend_error (allow for YAML rules).
    #[arg(long, value_name = "MODE", env = "THROTTLEGATE_ON_BACKEND_ERROR", value_parser = parse_mode)]
    pub on_backend_error: Option<throttlegate::FailureMode>,
    /// Add RateLimit, RateLimit-Policy and Retry-After to the gRPC answers' response_headers_to_add.
    #[arg(long, env = "THROTTLEGATE_RESPONSE_HEADERS")]
    pub response_headers: bool,
    /// Reload on SIGHUP only, not when the rules file changes.
    #[arg(long, env = "THROTTLEGATE_NO_WATCH")]
    pub no_watch: bool,
}

pub fn run(a: ServeArgs) -> CliResult<u8> {
    let config = throttlegate_server::Config {
        rules: a.rules,
        url: a.url,
        grpc: a.grpc,
        http: a.http,
        response_headers: a.response_headers,
        timeout: a.timeout,
        on_backend_error: a.on_backend_error,
        watch: !a.no_watch,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::usage(format!("cannot start the runtime: {e}")))?;
    rt.block_on(throttlegate_server::run(config))?;
    Ok(0)
}

fn parse_mode(text: &str) -> Result<throttlegate::FailureMode, String> {
    throttlegate::FailureMode::parse(text).map_err(|e| e.message().to_string())
}
