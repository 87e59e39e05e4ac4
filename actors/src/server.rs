//! `Server`: what the HTTP layer holds to reach the actors.

use ractor::{Actor, ActorRef};
use skillhost_engine::EngineConfig;
use tokio::sync::{mpsc, watch};

use crate::chat_loop::LoopMsg;
use crate::request::{ChatError, ChatEvent, ChatRequest};
use crate::supervisor::{ModelStatus, Supervisor, SupervisorArgs, SupervisorMsg};

/// How long starting a request may wait for the supervisor. Loading a model
/// happens in the supervisor's mailbox, so this covers a reload in progress.
const START_TIMEOUT_MS: u64 = 120_000;

/// A cheap, clonable handle to the running actor system.
#[derive(Clone)]
pub struct Server {
    supervisor: ActorRef<SupervisorMsg>,
    status: watch::Receiver<ModelStatus>,
}

/// A running chat request. Dropping it stops the request's actor, which
/// cancels its generation: this is how a client disconnect propagates.
pub struct ChatStream {
    pub events: mpsc::UnboundedReceiver<ChatEvent>,
    actor: ActorRef<LoopMsg>,
}

impl Drop for ChatStream {
    fn drop(&mut self) {
        self.actor.stop(Some("the HTTP request ended".into()));
    }
}

impl Server {
    /// Starts the supervisor, which begins loading the model in the background.
    pub async fn start(engine: EngineConfig) -> Result<Server, String> {
        let (status_tx, status) = watch::channel(ModelStatus::Loading);
        let (supervisor, _) = Actor::spawn(None, Supervisor, SupervisorArgs { engine, status: status_tx })
            .await
            .map_err(|err| format!("cannot start the supervisor: {err}"))?;
        Ok(Server { supervisor, status })
    }

    /// The current model status.
    pub fn status(&self) -> ModelStatus {
        self.status.borrow().clone()
    }

    /// Waits until the model is ready or failed to load.
    pub async fn wait_until_loaded(&self) -> ModelStatus {
        let mut status = self.status.clone();
        loop {
            let current = status.borrow_and_update().clone();
            if !matches!(current, ModelStatus::Loading) {
                return current;
            }
            if status.changed().await.is_err() {
                return current;
            }
        }
    }

    /// Starts a chat request.
    pub async fn chat(&self, request: ChatRequest) -> Result<ChatStream, ChatError> {
        if let ModelStatus::Loading = *self.status.borrow() {
            return Err(ChatError::Unavailable("the model is loading; try again shortly".into()));
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let result = ractor::call_t!(
            self.supervisor,
            |reply| SupervisorMsg::StartChat { request: Box::new(request), events: events_tx, reply },
            START_TIMEOUT_MS
        );
        match result {
            Ok(Ok(actor)) => Ok(ChatStream { events, actor }),
            Ok(Err(err)) => Err(err),
            Err(err) => Err(ChatError::Unavailable(format!("the server is not accepting requests: {err}"))),
        }
    }

    /// Makes the engine thread panic (fault-injection builds only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_engine_panic(&self) {
        let _ = self.supervisor.cast(SupervisorMsg::InjectEnginePanic);
    }

    /// Stops the actor system.
    pub fn shutdown(&self) {
        self.supervisor.stop(None);
    }
}
