//! CPU reference lane.
