//! throttlegate-c (being written).
