//! dshdb fleet mode: many nodes, each with its local dshdb store as the hot tier, on NATS
//! JetStream (the replicated commit tail and the coordination KV) and S3-compatible object
//! storage (sealed runs, manifest copies). Design: FLEET.md of issue #17; wire and object
//! layouts: `format-spec/09-fleet.md`.
//!
//! Layers: [`wire`] and [`shard`] (names and bytes) → [`backend`] (the three service traits)
//! with [`fake`] (deterministic in-memory fakes) and `nats`/`s3` (real clients) → [`tier`]
//! (the local store) → [`node`] (the protocol).

pub mod backend;
pub mod error;
pub mod fake;
pub mod modes;
pub mod nats;
pub mod node;
pub mod s3;
pub mod sealer;
pub mod serve;
pub mod shard;
pub mod tier;
pub mod triggers;
pub mod wire;

pub use error::{BackendError, FleetError, FleetResult};
pub use modes::{AtRiskWindow, DurabilityMode, ReplicationLag, ShipRound, UnshippedRange};
pub use node::{AppendAck, IncomingEvent, Node, NodeConfig, SealReport, SealStep};
