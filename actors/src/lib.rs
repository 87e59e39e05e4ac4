//! skillhost's actors: a supervisor with a model actor and one loop actor per
//! chat request, on ractor.
//!
//! Code map:
//! - [`supervisor`]: loads the model, restarts it when the engine dies, spawns
//!   request actors.
//! - [`model`]: `ModelActor`, the owner of the engine thread's lifetime.
//! - [`chat_loop`]: `LoopActor`, one chat request; `output` splits generated
//!   text into streamed content and tool calls.
//! - [`request`]: the validated request and the events a request reports.
//! - [`skills`]: Agent Skills: manifests, the path guard, the registry and its
//!   actor, ZIP installs.
//! - [`server`]: the handle the HTTP layer holds.
//! - [`tools`]: the closed set of tools the server answers, one file each.
//! - [`workspace`]: request folders, the one handle into them
//!   (`workspace::handle`) and the `WorkspaceActor` that owns one.
//! - [`sandbox`]: the `SandboxActor`, the launcher of the sandbox helper,
//!   profiles, per-workspace uids and per-command control groups.
//! - [`artifacts`]: the `ArtifactStoreActor` and its bounded store.
//! - [`task`]: `AbortOnDrop`, a task that ends with its owner.

pub mod artifacts;
pub mod chat_loop;
pub mod model;
pub mod replica;
pub mod request;
pub mod sandbox;
pub mod server;
pub mod skills;
pub mod supervisor;
pub mod task;
pub mod tools;
pub mod workspace;

pub use request::{ChatError, ChatEvent, ChatFinish, ChatRequest, Usage};
pub use server::{ChatStream, Server, ServerConfig, SkillsHandle};
pub use supervisor::ModelStatus;
