//! throttlegate-python (being written).
