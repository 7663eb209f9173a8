//! The token meter: real BPE token counts (tiktoken) per surface node and in total, kept
//! incrementally as the surface is appended to and rewritten.

use super::units::{check_next, splice_node};
use super::{decode_postcard, encode_postcard, ProjectionUnit};
use crate::error::Result;
use crate::session::json::value_lossy;
use crate::session::surface::projected_message;
use crate::session::SessionEvent;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use tiktoken_rs::CoreBPE;

/// Tokens added per message for its framing (role, separators), as DSH's heuristic does.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// A tiktoken encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenEncoding {
    /// GPT-4o family (the default).
    #[default]
    O200kBase,
    /// GPT-4 / GPT-3.5 family.
    Cl100kBase,
}

impl TokenEncoding {
    /// The encoding's tiktoken name.
    pub fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
        }
    }

    /// Parses a tiktoken name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "o200k_base" => Some(Self::O200kBase),
            "cl100k_base" => Some(Self::Cl100kBase),
            _ => None,
        }
    }

    fn bpe(self) -> Arc<Mutex<CoreBPE>> {
        match self {
            Self::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Self::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

/// Token counts of the visible surface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMeterState {
    pub next_seq: u64,
    /// Per visible node in positional order: its seq and its price in tokens.
    pub nodes: Vec<(u64, u64)>,
    /// Sum of the node prices.
    pub total: u64,
}

/// The token meter unit; state is [`TokenMeterState`].
#[derive(Clone)]
pub struct TokenMeterUnit {
    encoding: TokenEncoding,
    bpe: Arc<Mutex<CoreBPE>>,
}

impl std::fmt::Debug for TokenMeterUnit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TokenMeterUnit")
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl Default for TokenMeterUnit {
    fn default() -> Self {
        Self::new(TokenEncoding::default())
    }
}

impl TokenMeterUnit {
    /// A meter with `encoding` (its tables load once per process).
    pub fn new(encoding: TokenEncoding) -> Self {
        Self {
            encoding,
            bpe: encoding.bpe(),
        }
    }

    pub fn encoding(&self) -> TokenEncoding {
        self.encoding
    }

    /// Tokens of a plain text.
    pub fn text_tokens(&self, text: &str) -> u64 {
        self.bpe.lock().encode_ordinary(text).len() as u64
    }

    /// The price of one message (JSON text): its text-bearing fields plus the framing.
    pub fn message_tokens(&self, message_text: &str) -> u64 {
        let message = value_lossy(message_text).unwrap_or(Value::Null);
        let mut pieces = Vec::new();
        if let Some(blocks) = message.get("content").and_then(Value::as_array) {
            collect_block_texts(blocks, &mut pieces);
        }
        let bpe = self.bpe.lock();
        let content: usize = pieces
            .iter()
            .map(|piece| bpe.encode_ordinary(piece).len())
            .sum();
        content as u64 + MESSAGE_OVERHEAD_TOKENS
    }
}

/// The texts a model reads from content blocks: text and reasoning, tool-call name and
/// arguments, tool-result inner blocks; any other block as its JSON text.
fn collect_block_texts(blocks: &[Value], pieces: &mut Vec<String>) {
    for block in blocks {
        let field = |key: &str| block.get(key).and_then(Value::as_str).map(str::to_owned);
        match block.get("type").and_then(Value::as_str) {
            Some("text") | Some("reasoning") => pieces.extend(field("text")),
            Some("tool-call") => {
                pieces.extend(field("name"));
                match block.get("arguments") {
                    Some(Value::String(arguments)) => pieces.push(arguments.clone()),
                    Some(arguments) => pieces.push(arguments.to_string()),
                    None => {}
                }
            }
            Some("tool-result") => {
                if let Some(inner) = block.get("content").and_then(Value::as_array) {
                    collect_block_texts(inner, pieces);
                }
            }
            _ => pieces.push(block.to_string()),
        }
    }
}

impl ProjectionUnit for TokenMeterUnit {
    type State = TokenMeterState;

    fn name(&self) -> String {
        format!("tokens.{}", self.encoding.name())
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> TokenMeterState {
        TokenMeterState::default()
    }
    fn apply(&self, state: &mut TokenMeterState, event: &SessionEvent) -> Result<()> {
        check_next("tokens", &mut state.next_seq, event)?;
        let price = || {
            if event.surface_op.is_none() {
                return 0;
            }
            projected_message(event)
                .map(|message| self.message_tokens(message.get()))
                .unwrap_or(0)
        };
        let price = price();
        if let Some(removed) = splice_node("tokens", &mut state.nodes, event, || price)? {
            let shadowed: u64 = removed.iter().map(|(_, tokens)| tokens).sum();
            state.total = state.total.saturating_sub(shadowed).saturating_add(price);
        }
        Ok(())
    }
    fn encode(&self, state: &TokenMeterState) -> Result<Vec<u8>> {
        encode_postcard("tokens", state)
    }
    fn decode(&self, bytes: &[u8]) -> Result<TokenMeterState> {
        decode_postcard("tokens", bytes)
    }
}
