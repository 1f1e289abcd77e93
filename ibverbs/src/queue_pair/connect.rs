//! PLACEHOLDER: connect helpers (being written).
