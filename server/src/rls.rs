//! The messages of Envoy's rate limit service (`envoy.service.ratelimit.v3`,
//! `rls.proto`, with the descriptor of `envoy.extensions.common.ratelimit.v3`
//! and `envoy.config.core.v3.HeaderValue`), written out with prost's derive
//! so that no `protoc` is needed to build. Field numbers and types are the
//! protos'; the fields this server never reads or sets are kept so that
//! messages round-trip.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain: which set of limits applies.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each checked against the domain's limits.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Hits this request adds to every matched limit; 0 means 1 (unset in proto3).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The ordered key/value entries.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit given by the client in place of the configured one (refused by this server).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// This descriptor's hits, overriding the request's; 0 checks without counting.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<u64>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    /// The entry's key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The entry's value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// OK or OVER_LIMIT for the whole request (see [`code`]).
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    /// One status per descriptor of the request, in order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the client's response.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for the upstream request.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// A body for the denied response (not set by this server).
    #[prost(bytes = "vec", tag = "5")]
    pub raw_body: Vec<u8>,
}

/// `RateLimitResponse.RateLimit`: the limit a descriptor matched.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// The limit's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit (see [`unit`]).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT for this descriptor.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The limit matched, if any.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// Units left.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// When denied, how long until a request would pass; otherwise until the limit is full again.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<prost_types::Duration>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    /// The header's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header's value.
    #[prost(string, tag = "2")]
    pub value: String,
    /// The value as bytes (not set by this server).
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

/// `RateLimitResponse.Code` values.
pub mod code {
    /// Not set.
    pub const UNKNOWN: i32 = 0;
    /// Admitted.
    pub const OK: i32 = 1;
    /// Denied.
    pub const OVER_LIMIT: i32 = 2;

    /// The proto3 JSON name of a code.
    pub fn name(code: i32) -> &'static str {
        match code {
            OK => "OK",
            OVER_LIMIT => "OVER_LIMIT",
            _ => "UNKNOWN",
        }
    }
}

/// `RateLimitResponse.RateLimit.Unit` (and `envoy.type.v3.RateLimitUnit`) names.
pub mod unit {
    /// The proto3 JSON name of a unit.
    pub fn name(unit: i32) -> &'static str {
        match unit {
            1 => "SECOND",
            2 => "MINUTE",
            3 => "HOUR",
            4 => "DAY",
            5 => "MONTH",
            6 => "YEAR",
            7 => "WEEK",
            _ => "UNKNOWN",
        }
    }
}
