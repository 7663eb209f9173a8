//! `dshdb-fleet-node --id ID --listen ADDR --store DIR [--ttl-ms N] [--tick-ms N] [--shards N]
//! [--mode replicated|local|sealed] [--degrade-to-local-after-ms N] [--seal-tail-bytes N]
//! [--seal-idle-ms N]`:
//! one fleet node process (the same as `dshdb fleet-node`), configured for NATS and S3 by
//! the `DSHDB_FLEET_*` variables. The multi-process tests start it so that `kill -9` is real.

use dshdb_fleet::serve::{
    config_from_env, run, seal_trigger, DEFAULT_NODE_TTL, DEFAULT_TICK_INTERVAL,
};
use dshdb_fleet::shard::SHARD_COUNT;
use dshdb_fleet::DurabilityMode;
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage: dshdb-fleet-node --id ID --listen ADDR --store DIR \
                     [--ttl-ms N] [--tick-ms N] [--shards N] \
                     [--mode replicated|local|sealed] [--degrade-to-local-after-ms N] \
                     [--seal-tail-bytes N] [--seal-idle-ms N]";

fn parse_number(name: &str, value: &str) -> Result<u64, String> {
    value
        .parse()
        .map_err(|_| format!("{name} wants a number, got {value:?}"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut arguments = std::env::args().skip(1);
    let (mut id, mut listen, mut store) = (None, None, None);
    let (mut ttl, mut tick, mut shards) = (DEFAULT_NODE_TTL, DEFAULT_TICK_INTERVAL, SHARD_COUNT);
    let (mut mode, mut degrade_after) = (None, None);
    let (mut seal_tail_bytes, mut seal_idle_ms) = (None, None);
    while let Some(name) = arguments.next() {
        let value = arguments.next().ok_or(USAGE)?;
        match name.as_str() {
            "--id" => id = Some(value),
            "--listen" => listen = Some(value),
            "--store" => store = Some(PathBuf::from(value)),
            "--ttl-ms" => ttl = Duration::from_millis(parse_number(&name, &value)?),
            "--tick-ms" => tick = Duration::from_millis(parse_number(&name, &value)?),
            "--shards" => shards = u32::try_from(parse_number(&name, &value)?)?,
            "--mode" => mode = Some(value.parse::<DurabilityMode>()?),
            "--degrade-to-local-after-ms" => degrade_after = Some(parse_number(&name, &value)?),
            "--seal-tail-bytes" => seal_tail_bytes = Some(seal_trigger(&name, &value)?),
            "--seal-idle-ms" => seal_idle_ms = Some(seal_trigger(&name, &value)?),
            _ => return Err(USAGE.into()),
        }
    }
    let mut config = config_from_env(
        &id.ok_or(USAGE)?,
        &listen.ok_or(USAGE)?,
        store.ok_or(USAGE)?,
        ttl,
        tick,
        shards,
    )?;
    // Flags win over the DSHDB_FLEET_MODE / DSHDB_FLEET_DEGRADE_TO_LOCAL_AFTER_MS variables.
    if let Some(mode) = mode {
        config.mode = mode;
    }
    if degrade_after.is_some() {
        config.degrade_to_local_after_ms = degrade_after;
    }
    // 0 turns a trigger off; flags win over DSHDB_FLEET_SEAL_TAIL_BYTES / _IDLE_MS.
    if let Some(tail_bytes) = seal_tail_bytes {
        config.seal_policy.tail_bytes = tail_bytes;
    }
    if let Some(idle_ms) = seal_idle_ms {
        config.seal_policy.idle_ms = idle_ms;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(config))?;
    Ok(())
}
