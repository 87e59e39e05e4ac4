//! skillhost's actors: a supervisor with a model actor and one loop actor per
//! chat request, on ractor.
//!
//! Code map:
//! - [`supervisor`]: loads the model, restarts it when the engine dies, spawns
//!   request actors.
//! - [`model`]: `ModelActor`, the owner of the engine thread's lifetime.
//! - [`chat_loop`]: `LoopActor`, one chat request; `output` splits generated
//!   text into streamed content and tool calls.
//! - [`request`]: the validated request, the events a request reports and the
//!   types they carry.
//! - [`path_guard`]: the one check every path a skill, an archive or a
//!   workspace names goes through.
//! - [`skills`]: Agent Skills: manifests, the registry and its actor, ZIP
//!   installs.
//! - [`server`]: the handle the HTTP layer holds.
//! - [`tools`]: the closed set of tools the server answers, one file each,
//!   the router that sends a call to its tool, and the `WorkspaceActor`
//!   that answers the code calls made in one folder.
//! - [`workspace`]: request folders, the one handle into them
//!   (`workspace::handle`), their uids and their memory budget.
//! - [`conversations`]: Web UI conversations and the workspace actor each
//!   keeps.
//! - [`sandbox`]: the `SandboxActor`, the launcher of the sandbox helper,
//!   profiles, per-command control groups, the install settings.
//! - [`artifacts`]: the `ArtifactStoreActor` and its bounded store.
//! - [`attachments`]: files a user attached: their limits, names, types
//!   and the prompt's line for each.
//! - [`surface`]: the ways a chat request reaches the loop.
//! - [`task`]: `AbortOnDrop`, a task that ends with its owner.
//! - [`store`]: the state folder's SQLite file: stored responses,
//!   conversations and files, opened once, refused when damaged, foreign or
//!   newer.

pub mod artifacts;
pub mod attachments;
pub mod chat_loop;
pub mod conversations;
pub mod model;
pub mod path_guard;
pub mod replica;
pub mod request;
pub mod sandbox;
pub mod server;
pub mod skills;
pub mod store;
pub mod supervisor;
pub mod surface;
pub mod task;
pub mod tools;
pub mod workspace;

pub use request::{ChatError, ChatEvent, ChatFinish, ChatRequest, Usage};
pub use server::{ChatStream, Server, ServerConfig, SkillsHandle, StartError};
pub use supervisor::{ModelStatus, ModelView, ModelsView};
