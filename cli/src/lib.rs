//! throttlegate-cli (being written).
