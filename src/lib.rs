//! Examples and device tests live in this package.
