//! `ModelActor`: owns the engine's lifetime. It starts the engine thread,
//! hands out the channel to it, and fails (so the supervisor restarts it) when
//! the engine thread dies.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use skillhost_engine::{Engine, EngineConfig, Exit};

/// The model actor; it holds no llama.cpp type, only the engine's channel.
pub struct ModelActor;

pub enum ModelMsg {
    /// Sent by the supervisor when it starts a request: the channel to the engine.
    GetEngine(RpcReplyPort<Engine>),
    /// Sent by the watcher task when the engine thread ends.
    EngineExited(Exit),
    /// Sent by tests to make the engine thread panic.
    #[cfg(feature = "fault-injection")]
    InjectPanic,
}

pub struct ModelState {
    /// The handle to the running engine.
    engine: Engine,
}

impl Actor for ModelActor {
    type Msg = ModelMsg;
    type State = ModelState;
    type Arguments = EngineConfig;

    /// Loads the model on a blocking thread; the actor starts once it is in memory.
    async fn pre_start(
        &self,
        myself: ActorRef<ModelMsg>,
        config: EngineConfig,
    ) -> Result<ModelState, ActorProcessingErr> {
        let (engine, exit) = tokio::task::spawn_blocking(move || Engine::start(config)).await??;
        tokio::spawn(async move {
            let exit = exit.await.unwrap_or(Exit::Panicked("the engine thread vanished".into()));
            let _ = myself.cast(ModelMsg::EngineExited(exit));
        });
        Ok(ModelState { engine })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ModelMsg>,
        msg: ModelMsg,
        state: &mut ModelState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ModelMsg::GetEngine(reply) => {
                let _ = reply.send(state.engine.clone());
                Ok(())
            }
            // Failing hands the decision to the supervisor, which restarts us.
            ModelMsg::EngineExited(Exit::Panicked(message)) => Err(message.into()),
            ModelMsg::EngineExited(Exit::Normal) => Err("the engine thread ended".into()),
            #[cfg(feature = "fault-injection")]
            ModelMsg::InjectPanic => {
                state.engine.inject_panic();
                Ok(())
            }
        }
    }
}
