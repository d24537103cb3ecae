//! Helpers shared by integration tests.

pub mod gotmpl;
pub mod values;
