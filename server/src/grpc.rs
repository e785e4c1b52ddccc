//! `envoy.service.ratelimit.v3.RateLimitService` as a tonic service, written
//! as tonic's code generator writes one (no `protoc` at build time).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::rls::{RateLimitRequest, RateLimitResponse};
use crate::service::{CheckError, State};
use crate::Server;

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message accepted (gRPC's usual 4 MiB).
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// The rate limit service over a server's state.
#[derive(Clone)]
pub struct RateLimitService {
    server: Arc<Server>,
}

impl RateLimitService {
    /// The service answering from `server`.
    pub fn new(server: Arc<Server>) -> RateLimitService {
        RateLimitService { server }
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// The gRPC status of a failed check.
pub fn status(e: CheckError) -> Status {
    match e {
        CheckError::BadRequest(m) => Status::invalid_argument(m),
        CheckError::Unavailable(m) => Status::unavailable(m),
        CheckError::Internal(m) => Status::internal(m),
    }
}

struct ShouldRateLimit(Arc<Server>);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            let state: Arc<State> = server.state.clone();
            let req = request.into_inner();
            state.should_rate_limit(&req).await.map(Response::new).map_err(status)
        })
    }
}

impl<B> Service<http::Request<B>> for RateLimitService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == SHOULD_RATE_LIMIT {
            let server = self.server.clone();
            Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<RateLimitResponse, RateLimitRequest>::default();
                let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_MESSAGE);
                Ok(grpc.unary(ShouldRateLimit(server), req).await)
            })
        } else {
            Box::pin(async move { Ok(Status::unimplemented(format!("no method {}", req.uri().path())).into_http()) })
        }
    }
}
