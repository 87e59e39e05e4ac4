//! `ModelActor`: owns the engine's lifetime. It starts the engine thread,
//! hands out the channel to it, and fails (so the supervisor restarts it) when
//! the engine thread dies.

pub mod backend;
pub mod catalog;
pub mod scripted;

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use skillhost_engine::{Engine, EngineConfig, Exit, LoadProgress, Remote, RemoteConfig};

pub use backend::ModelBackend;
pub use catalog::{Catalog, ModelEntry, ModelLimits};

/// Where the model comes from.
#[derive(Clone)]
pub enum ModelSource {
    /// Load a GGUF file into a new engine thread.
    Load(EngineConfig),
    /// Send generation to upstream servers; no weights are loaded here.
    Remote(RemoteConfig),
    /// Use a backend that already exists (tests use a scripted one).
    Provided(Arc<dyn ModelBackend>),
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Load(config) => f.debug_tuple("Load").field(config).finish(),
            ModelSource::Remote(config) => f.debug_tuple("Remote").field(&config.upstreams.len()).finish(),
            ModelSource::Provided(backend) => f.debug_tuple("Provided").field(&backend.info().id).finish(),
        }
    }
}

impl ModelSource {
    /// The name requests use for it before it is loaded: the configured
    /// name or the file's; an upstream fleet's and a provided model's come
    /// from their own facts once loaded (see the supervisor's `resolve`).
    pub fn name(&self) -> String {
        match self {
            ModelSource::Load(config) => {
                config.name.clone().unwrap_or_else(|| skillhost_engine::file_model_name(&config.model_path))
            }
            ModelSource::Remote(config) => config.name.clone().unwrap_or_else(|| self.describe()),
            ModelSource::Provided(backend) => backend.info().id.clone(),
        }
    }

    /// Other names requests may use for it (a `models:` entry's `aliases`).
    pub fn aliases(&self) -> &[String] {
        match self {
            ModelSource::Load(config) => &config.aliases,
            ModelSource::Remote(config) => &config.aliases,
            ModelSource::Provided(_) => &[],
        }
    }

    /// A name for logs: the model file or the provided model's id.
    pub fn describe(&self) -> String {
        match self {
            ModelSource::Load(config) => config.model_path.display().to_string(),
            ModelSource::Remote(config) => {
                config.upstreams.iter().map(|u| u.url.as_str()).collect::<Vec<_>>().join(", ")
            }
            ModelSource::Provided(backend) => backend.info().id.clone(),
        }
    }
}

/// The model actor; it holds no llama.cpp type, only the engine's channel.
pub struct ModelActor;

pub enum ModelMsg {
    /// Sent by the supervisor when it starts a request: the model to use.
    GetEngine(RpcReplyPort<Arc<dyn ModelBackend>>),
    /// Sent by the watcher task when the engine thread ends.
    EngineExited(Exit),
    /// Sent by tests to make the engine thread panic.
    InjectPanic,
}

pub struct ModelState {
    /// The running model.
    backend: Arc<dyn ModelBackend>,
    /// The engine itself, when this actor started one (for fault injection).
    engine: Option<Engine>,
}

impl Actor for ModelActor {
    type Msg = ModelMsg;
    type State = ModelState;
    /// What to load, and where to report how far the weights are read.
    type Arguments = (ModelSource, LoadProgress);

    /// Loads the model on a blocking thread; the actor starts once it is in memory.
    async fn pre_start(
        &self,
        myself: ActorRef<ModelMsg>,
        (source, progress): (ModelSource, LoadProgress),
    ) -> Result<ModelState, ActorProcessingErr> {
        let config = match source {
            ModelSource::Provided(backend) => return Ok(ModelState { backend, engine: None }),
            ModelSource::Load(config) => config,
            ModelSource::Remote(config) => {
                // The fleet has no thread to die: an upstream that fails is
                // marked down and its requests go elsewhere.
                let remote = tokio::task::spawn_blocking(move || Remote::start(config)).await??;
                return Ok(ModelState { backend: Arc::new(remote), engine: None });
            }
        };
        let (engine, exit) = tokio::task::spawn_blocking(move || Engine::start_reporting(config, progress)).await??;
        tokio::spawn(async move {
            let exit = exit.await.unwrap_or(Exit::Panicked("the engine thread vanished".into()));
            let _ = myself.cast(ModelMsg::EngineExited(exit));
        });
        Ok(ModelState { backend: Arc::new(engine.clone()), engine: Some(engine) })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ModelMsg>,
        msg: ModelMsg,
        state: &mut ModelState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ModelMsg::GetEngine(reply) => {
                let _ = reply.send(Arc::clone(&state.backend));
                Ok(())
            }
            // Failing hands the decision to the supervisor, which restarts us.
            ModelMsg::EngineExited(Exit::Panicked(message)) => Err(message.into()),
            ModelMsg::EngineExited(Exit::Normal) => Err("the engine thread ended".into()),
            ModelMsg::InjectPanic => {
                if let Some(engine) = &state.engine {
                    engine.inject_panic();
                }
                Ok(())
            }
        }
    }
}
