//! Helpers shared by integration tests.

pub mod helm;
pub mod values;
