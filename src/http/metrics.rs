//! Prometheus metrics, kept in a registry owned by the app (no globals).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use skillhost_actors::chat_loop::agents::AgentStats;
use skillhost_actors::skills::outcomes::{Outcome, SkillOutcomes};
use skillhost_actors::{ModelStatus, Server};
use skillhost_engine::Timings;

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub errors: IntCounterVec,
    pub prompt_tokens: IntCounter,
    pub cached_prompt_tokens: IntCounter,
    pub copied_prompt_tokens: IntCounter,
    pub generated_tokens: IntCounter,
    pub time_to_first_token: Histogram,
    pub tokens_per_second: Histogram,
    pub skill_steps: IntCounterVec,
    /// Requests the access gate refused, by reason (the error kind).
    pub refused: IntCounterVec,
    admitted: IntGauge,
    conversations: IntGauge,
    active_slots: IntGauge,
    queued: IntGauge,
    cancelled: IntGauge,
    model_ready: IntGauge,
    models_loaded: IntGaugeVec,
    model_running_turns: IntGaugeVec,
    /// The engine gauges of every model, by its name (the unlabelled
    /// ones above are the default model's, as before several models).
    model_active_slots: IntGaugeVec,
    model_queued: IntGaugeVec,
    model_batch_sequences_max: IntGaugeVec,
    batch_sequences_max: IntGauge,
    draft_tokens: IntCounter,
    draft_accepted_tokens: IntCounter,
    upstreams: UpstreamMetrics,
    agents: AgentMetrics,
    skills: SkillMetrics,
    /// Calls to MCP tools, copied from the hub's counts at scrape time.
    mcp_calls: IntCounterVec,
    /// Rewrites of `--normalize-client-prompts`, by rule.
    client_prompt_rewrites: IntCounterVec,
}

/// Per-skill outcomes, copied from the server's table at scrape time.
struct SkillMetrics {
    events: IntCounterVec,
    outcomes: IntCounterVec,
}

impl SkillMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = SkillMetrics {
            events: IntCounterVec::new(
                Opts::new(
                    "skill_events_total",
                    "Times each skill was advertised in a prompt, read (its SKILL.md), run (a script) or had an MCP tool it names called (mcp_call), by surface.",
                ),
                &["skill", "event", "surface"],
            )?,
            outcomes: IntCounterVec::new(
                Opts::new(
                    "skill_turn_outcomes_total",
                    "How the turns that read or ran each skill ended: answer, error, tool_call (the caller's), budget (a bound cut it) or cancelled (the client left), by surface.",
                ),
                &["skill", "outcome", "surface"],
            )?,
        };
        registry.register(Box::new(metrics.events.clone()))?;
        registry.register(Box::new(metrics.outcomes.clone()))?;
        Ok(metrics)
    }

    fn update(&self, table: &SkillOutcomes) {
        for (skill, surface, counts) in table.all() {
            let surface = surface.as_str();
            for (event, value) in [
                ("advertised", counts.advertised),
                ("read", counts.read),
                ("run", counts.run),
                ("mcp_call", counts.mcp_calls),
            ] {
                raise(&self.events.with_label_values(&[skill.as_str(), event, surface]), value);
            }
            for outcome in Outcome::ALL {
                raise(
                    &self.outcomes.with_label_values(&[skill.as_str(), outcome.as_str(), surface]),
                    counts.outcome(outcome),
                );
            }
        }
    }
}

/// Child agents, copied from the server's counters at scrape time.
struct AgentMetrics {
    spawned: IntCounter,
    finished: IntCounter,
    stopped: IntCounter,
    failed: IntCounter,
    open: IntGauge,
}

impl AgentMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = AgentMetrics {
            spawned: IntCounter::new("agents_spawned_total", "Child agents started with spawn_agent.")?,
            finished: IntCounter::new("agents_finished_total", "Reports child agents finished (one per task).")?,
            stopped: IntCounter::new(
                "agents_stopped_total",
                "Child agents closed by their parent, or stopped with it while working.",
            )?,
            failed: IntCounter::new("agents_failed_total", "Child agents that ended with an error or a crash.")?,
            open: IntGauge::new("agents_open", "Child agents alive right now.")?,
        };
        registry.register(Box::new(metrics.spawned.clone()))?;
        registry.register(Box::new(metrics.finished.clone()))?;
        registry.register(Box::new(metrics.stopped.clone()))?;
        registry.register(Box::new(metrics.failed.clone()))?;
        registry.register(Box::new(metrics.open.clone()))?;
        Ok(metrics)
    }

    fn update(&self, stats: &AgentStats) {
        sync(&self.spawned, &stats.spawned);
        sync(&self.finished, &stats.finished);
        sync(&self.stopped, &stats.stopped);
        sync(&self.failed, &stats.failed);
        self.open.set(stats.open.load(Ordering::SeqCst) as i64);
    }
}

/// Counters only grow: each scrape adds what the source gained since the
/// last one.
fn sync(counter: &IntCounter, source: &AtomicU64) {
    raise(counter, source.load(Ordering::Relaxed));
}

fn raise(counter: &IntCounter, now: u64) {
    let shown = counter.get();
    if now > shown {
        counter.inc_by(now - shown);
    }
}

/// Per-upstream series, copied from the fleet's counters at scrape time.
struct UpstreamMetrics {
    up: IntGaugeVec,
    in_flight: IntGaugeVec,
    requests: IntCounterVec,
    errors: IntCounterVec,
    retried: IntCounterVec,
    backpressure: IntCounterVec,
    affinity: IntCounterVec,
    first_token_seconds_sum: GaugeVec,
    first_tokens: IntCounterVec,
}

impl UpstreamMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let label = &["upstream"];
        let counter = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), label);
        let metrics = UpstreamMetrics {
            up: IntGaugeVec::new(Opts::new("upstream_up", "1 while the upstream passes its health checks."), label)?,
            in_flight: IntGaugeVec::new(Opts::new("upstream_in_flight", "Requests running on the upstream."), label)?,
            requests: counter("upstream_requests_total", "Requests sent to the upstream.")?,
            errors: counter(
                "upstream_errors_total",
                "Requests the upstream failed (refused connections, 5xx, broken streams).",
            )?,
            retried: counter(
                "upstream_retried_total",
                "Requests moved to another upstream after this one failed before the first token.",
            )?,
            backpressure: counter(
                "upstream_backpressure_total",
                "429/503 answers from the upstream asking for a pause.",
            )?,
            affinity: IntCounterVec::new(
                Opts::new(
                    "upstream_affinity_total",
                    "Requests whose conversation's home is the upstream: sent there (hit) or elsewhere (miss).",
                ),
                &["upstream", "result"],
            )?,
            first_token_seconds_sum: GaugeVec::new(
                Opts::new(
                    "upstream_first_token_seconds_sum",
                    "Time from sending to the first token, summed over requests.",
                ),
                label,
            )?,
            first_tokens: counter("upstream_first_token_seconds_count", "Requests whose first token arrived.")?,
        };
        registry.register(Box::new(metrics.up.clone()))?;
        registry.register(Box::new(metrics.in_flight.clone()))?;
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        registry.register(Box::new(metrics.retried.clone()))?;
        registry.register(Box::new(metrics.backpressure.clone()))?;
        registry.register(Box::new(metrics.affinity.clone()))?;
        registry.register(Box::new(metrics.first_token_seconds_sum.clone()))?;
        registry.register(Box::new(metrics.first_tokens.clone()))?;
        Ok(metrics)
    }

    fn update(&self, upstreams: &[std::sync::Arc<skillhost_engine::UpstreamStats>]) {
        for stats in upstreams {
            let url = stats.url.as_str();
            self.up.with_label_values(&[url]).set(i64::from(stats.up.load(Ordering::Relaxed)));
            self.in_flight.with_label_values(&[url]).set(stats.in_flight.load(Ordering::Relaxed) as i64);
            sync(&self.requests.with_label_values(&[url]), &stats.requests);
            sync(&self.errors.with_label_values(&[url]), &stats.errors);
            sync(&self.retried.with_label_values(&[url]), &stats.retried);
            sync(&self.backpressure.with_label_values(&[url]), &stats.backpressure);
            sync(&self.affinity.with_label_values(&[url, "hit"]), &stats.affinity_hits);
            sync(&self.affinity.with_label_values(&[url, "miss"]), &stats.affinity_misses);
            sync(&self.first_tokens.with_label_values(&[url]), &stats.first_tokens);
            let sum: Gauge = self.first_token_seconds_sum.with_label_values(&[url]);
            sum.set(stats.first_token_us.load(Ordering::Relaxed) as f64 / 1e6);
        }
    }
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("skillhost".into()), None)?;
        let requests = IntCounterVec::new(Opts::new("requests_total", "Chat requests received, by API."), &["api"])?;
        let errors =
            IntCounterVec::new(Opts::new("errors_total", "Requests that ended in an error, by kind."), &["kind"])?;
        let prompt_tokens = IntCounter::new("prompt_tokens_total", "Prompt tokens of finished requests.")?;
        let cached_prompt_tokens = IntCounter::new(
            "prompt_tokens_cached_total",
            "Prompt tokens reused from the KV cache instead of decoded.",
        )?;
        let copied_prompt_tokens = IntCounter::new(
            "prompt_tokens_copied_total",
            "Of the cached prompt tokens, those copied from another conversation's cache or the saved shared prefix.",
        )?;
        let generated_tokens = IntCounter::new("generated_tokens_total", "Tokens generated.")?;
        let time_to_first_token = Histogram::with_opts(
            HistogramOpts::new("time_to_first_token_seconds", "From request arrival to the first generated text.")
                .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )?;
        let tokens_per_second = Histogram::with_opts(
            HistogramOpts::new("generation_tokens_per_second", "Generation speed of each finished request.")
                .buckets(vec![1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0]),
        )?;
        let skill_steps = IntCounterVec::new(
            Opts::new("skill_tool_calls_total", "Skill tool calls answered in process, by tool and outcome."),
            &["tool", "ok"],
        )?;
        let refused = IntCounterVec::new(
            Opts::new(
                "refused_requests_total",
                "Requests refused before their handler ran (keys, origins, hosts, content type, capacity), by reason.",
            ),
            &["reason"],
        )?;
        let admitted = IntGauge::new(
            "admitted_requests",
            "Chat requests running or waiting for a slot (bounded by --max-queued).",
        )?;
        let conversations = IntGauge::new(
            "open_conversations",
            "Web UI conversations kept open (each may hold a workspace), at most 64.",
        )?;
        let active_slots = IntGauge::new("active_slots", "Slots decoding a request right now.")?;
        let queued = IntGauge::new("queued_requests", "Requests waiting for a free slot.")?;
        // A gauge fed from the engine's counter: it restarts at zero when the
        // engine restarts.
        let cancelled =
            IntGauge::new("cancelled_requests", "Requests the engine dropped because their client went away.")?;
        let model_ready = IntGauge::new("model_ready", "1 when the default model is loaded and serving.")?;
        let models_loaded = IntGaugeVec::new(
            Opts::new("model_loaded", "1 for each configured model in memory now, 0 for the others."),
            &["model"],
        )?;
        let model_running_turns =
            IntGaugeVec::new(Opts::new("model_running_turns", "Turns running on each model now."), &["model"])?;
        let model_active_slots = IntGaugeVec::new(
            Opts::new("model_active_slots", "Slots decoding a request right now, by model (0 while it is not loaded)."),
            &["model"],
        )?;
        let model_queued = IntGaugeVec::new(
            Opts::new("model_queued_requests", "Requests waiting for a free slot, by model."),
            &["model"],
        )?;
        let model_batch_sequences_max = IntGaugeVec::new(
            Opts::new(
                "model_batch_sequences_max",
                "Most sequences a model's engine decoded in one batch since it was loaded, by model.",
            ),
            &["model"],
        )?;
        let draft_tokens = IntCounter::new(
            "draft_tokens_total",
            "Tokens drafted from the context (--spec-lookup) and checked by the model.",
        )?;
        let draft_accepted_tokens = IntCounter::new(
            "draft_accepted_tokens_total",
            "Drafted tokens the model's own sampling kept (each one a decode step saved).",
        )?;
        let client_prompt_rewrites = IntCounterVec::new(
            Opts::new(
                "client_prompt_rewrites_total",
                "Lines a client changes between requests or sessions, removed by a rule of --normalize-client-prompts, by rule.",
            ),
            &["rule"],
        )?;
        let batch_sequences_max =
            IntGauge::new("batch_sequences_max", "Most sequences the engine decoded in one batch since it started.")?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(prompt_tokens.clone()))?;
        registry.register(Box::new(cached_prompt_tokens.clone()))?;
        registry.register(Box::new(copied_prompt_tokens.clone()))?;
        registry.register(Box::new(generated_tokens.clone()))?;
        registry.register(Box::new(time_to_first_token.clone()))?;
        registry.register(Box::new(tokens_per_second.clone()))?;
        registry.register(Box::new(skill_steps.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(admitted.clone()))?;
        registry.register(Box::new(conversations.clone()))?;
        registry.register(Box::new(active_slots.clone()))?;
        registry.register(Box::new(queued.clone()))?;
        registry.register(Box::new(cancelled.clone()))?;
        registry.register(Box::new(model_ready.clone()))?;
        registry.register(Box::new(models_loaded.clone()))?;
        registry.register(Box::new(model_running_turns.clone()))?;
        registry.register(Box::new(model_active_slots.clone()))?;
        registry.register(Box::new(model_queued.clone()))?;
        registry.register(Box::new(model_batch_sequences_max.clone()))?;
        registry.register(Box::new(batch_sequences_max.clone()))?;
        registry.register(Box::new(draft_tokens.clone()))?;
        registry.register(Box::new(client_prompt_rewrites.clone()))?;
        registry.register(Box::new(draft_accepted_tokens.clone()))?;
        let upstreams = UpstreamMetrics::new(&registry)?;
        let agents = AgentMetrics::new(&registry)?;
        let skills = SkillMetrics::new(&registry)?;
        let mcp_calls = IntCounterVec::new(
            Opts::new(
                "mcp_calls_total",
                "Calls to the tools of the operator's MCP servers, by server, tool and outcome: ok, error (the tool said it failed), failed (the server could not be reached or died) or timeout.",
            ),
            &["server", "tool", "outcome"],
        )?;
        registry.register(Box::new(mcp_calls.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            errors,
            prompt_tokens,
            cached_prompt_tokens,
            copied_prompt_tokens,
            generated_tokens,
            time_to_first_token,
            tokens_per_second,
            skill_steps,
            refused,
            admitted,
            conversations,
            active_slots,
            queued,
            cancelled,
            model_ready,
            models_loaded,
            model_running_turns,
            model_active_slots,
            model_queued,
            model_batch_sequences_max,
            batch_sequences_max,
            draft_tokens,
            draft_accepted_tokens,
            upstreams,
            agents,
            skills,
            mcp_calls,
            client_prompt_rewrites,
        })
    }

    /// Counts the rewrites `--normalize-client-prompts` made to one request.
    pub fn client_prompt_rewrites(&self, applied: &[crate::client_prompts::Rule]) {
        for rule in applied {
            self.client_prompt_rewrites.with_label_values(&[rule.name()]).inc();
        }
    }

    /// Records a finished request.
    pub fn finished(&self, n_prompt: usize, timings: &Timings) {
        self.prompt_tokens.inc_by(n_prompt as u64);
        self.cached_prompt_tokens.inc_by(timings.cache_n as u64);
        self.copied_prompt_tokens.inc_by(timings.copied_n as u64);
        self.generated_tokens.inc_by(timings.predicted_n as u64);
        self.draft_tokens.inc_by(timings.draft_n as u64);
        self.draft_accepted_tokens.inc_by(timings.draft_n_accepted as u64);
        if timings.predicted_n > 1 {
            self.tokens_per_second.observe(timings.predicted_per_second());
        }
    }

    /// Records a skill tool call the loop answered.
    pub fn skill_step(&self, step: &skillhost_actors::request::SkillStep) {
        self.skill_steps.with_label_values(&[step.tool.as_str(), if step.ok { "true" } else { "false" }]).inc();
    }

    /// The text exposition, with gauges read from the engine at scrape time.
    pub fn render(&self, status: &ModelStatus, admitted: usize, conversations: usize, server: &Server) -> String {
        self.admitted.set(admitted as i64);
        self.agents.update(server.agent_stats());
        self.skills.update(server.skill_outcomes());
        if let Some(hub) = server.mcp() {
            for (name, tool, outcome, count) in hub.counts() {
                raise(&self.mcp_calls.with_label_values(&[name.as_str(), tool.as_str(), outcome.as_str()]), count);
            }
        }
        self.conversations.set(conversations as i64);
        for model in &server.models().models {
            let name = [model.name.as_str()];
            let loaded = matches!(model.status, ModelStatus::Ready { .. });
            self.models_loaded.with_label_values(&name).set(i64::from(loaded));
            self.model_running_turns.with_label_values(&name).set(model.running as i64);
            let (active, queued, batch) = match &model.status {
                ModelStatus::Ready { stats, .. } => (
                    stats.active_slots.load(Ordering::Relaxed),
                    stats.queued.load(Ordering::Relaxed),
                    stats.batch_sequences_max.load(Ordering::Relaxed),
                ),
                ModelStatus::Unloaded | ModelStatus::Loading | ModelStatus::Failed(_) => (0, 0, 0),
            };
            self.model_active_slots.with_label_values(&name).set(active as i64);
            self.model_queued.with_label_values(&name).set(queued as i64);
            self.model_batch_sequences_max.with_label_values(&name).set(batch as i64);
        }
        match status {
            ModelStatus::Ready { stats, .. } => {
                self.model_ready.set(1);
                self.active_slots.set(stats.active_slots.load(std::sync::atomic::Ordering::Relaxed) as i64);
                self.queued.set(stats.queued.load(std::sync::atomic::Ordering::Relaxed) as i64);
                self.cancelled.set(stats.cancelled.load(std::sync::atomic::Ordering::Relaxed) as i64);
                self.batch_sequences_max.set(stats.batch_sequences_max.load(Ordering::Relaxed) as i64);
                self.upstreams.update(&stats.upstreams);
            }
            ModelStatus::Unloaded | ModelStatus::Loading | ModelStatus::Failed(_) => {
                self.model_ready.set(0);
                self.active_slots.set(0);
                self.queued.set(0);
            }
        }
        let mut out = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %err, "cannot encode metrics");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}
