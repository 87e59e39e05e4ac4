//! Workspaces: the private folder a request's code tools work in, and the
//! file tools themselves.

pub mod apply_patch;
