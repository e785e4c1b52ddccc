//! throttlegate-node (being written).
