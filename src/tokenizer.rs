//! Text in and out of the language model: a checkpoint's `tokenizer.json` (through the HF
//! `tokenizers` crate), the DeepSeek chat prompt of vision.md §2.4, and a streaming detokenizer
//! that turns generated ids into text as soon as it is complete UTF-8.

pub mod gguf;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{DecodeStream, Tokenizer};

use crate::error::{Error, Result};
use crate::pipeline::PromptToken;

/// The tokenizer file of a checkpoint directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const END_THINK: &str = "</think>";
/// Ends an earlier assistant turn of a conversation.
pub const EOS: &str = "<｜end▁of▁sentence｜>";
/// The image placeholder (vision.md §2.3): one per image; the pipeline replaces it by the block.
pub const IMAGE_PLACEHOLDER: &str = "<｜deepseek_image｜>";

/// Every special token the chat prompt writes: each must be one added special token of
/// tokenizer.json, or the rendered prompt would be split into ordinary byte-level pieces.
const CHAT_SPECIAL_TOKENS: [&str; 5] = [BOS, USER, ASSISTANT, END_THINK, IMAGE_PLACEHOLDER];

/// One user turn in chat (non-thinking) mode.
#[derive(Clone, Debug, Default)]
pub struct ChatPrompt<'a> {
    /// Text between BOS and `<｜User｜>` (empty by default).
    pub system: &'a str,
    pub question: &'a str,
    /// How many images precede the question; each gets one placeholder, in order.
    pub n_images: usize,
}

/// One block of a user message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    Text(&'a str),
    /// An image: its placeholder, replaced by the image's block in the model input.
    Image,
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn<'a> {
    User(Vec<Part<'a>>),
    /// An earlier answer of the model.
    Assistant(&'a str),
}

/// A conversation in chat (non-thinking) mode; it ends with a user turn.
#[derive(Clone, Debug, Default)]
pub struct Conversation<'a> {
    /// Text between BOS and the first `<｜User｜>` (empty by default).
    pub system: &'a str,
    pub turns: Vec<Turn<'a>>,
}

impl<'a> From<&ChatPrompt<'a>> for Conversation<'a> {
    /// One user turn: an image block per image, then the question.
    fn from(p: &ChatPrompt<'a>) -> Self {
        let parts = std::iter::repeat_n(Part::Image, p.n_images).chain([Part::Text(p.question)]).collect();
        Conversation { system: p.system, turns: vec![Turn::User(parts)] }
    }
}

/// vision.md §2.4, chat (non-thinking) mode:
/// `<｜begin▁of▁sentence｜>{system}<｜User｜>{content}<｜Assistant｜></think>`. The user content is
/// its blocks joined with `"\n\n"`: one `<｜deepseek_image｜>` per image, in order, then the
/// question. A placeholder typed as text is rejected (§2.4), since it would silently become an
/// image slot.
pub fn render_chat(prompt: &ChatPrompt) -> Result<String> {
    render_conversation(&Conversation::from(prompt))
}

/// [`render_chat`] over several turns: each user turn is `<｜User｜>` and its blocks (text, or
/// `<｜deepseek_image｜>` for an image) joined with `"\n\n"`, in the order given; an earlier
/// answer is `<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>` (DeepSeek-V3.1's chat
/// template for past turns in non-thinking mode); the prompt ends with `<｜Assistant｜></think>`.
pub fn render_conversation(c: &Conversation) -> Result<String> {
    let placeholder = |what: &str, text: &str| {
        if text.contains(IMAGE_PLACEHOLDER) {
            return Err(Error::Invalid(format!(
                "{what} contains the image placeholder {IMAGE_PLACEHOLDER} as text; images go in as images \
                 (--image, or image_url parts of a request), one placeholder each"
            )));
        }
        Ok(())
    };
    placeholder("the system text", c.system)?;
    if !matches!(c.turns.last(), Some(Turn::User(_))) {
        return Err(Error::Invalid("a conversation must end with a user turn".into()));
    }
    let mut out = format!("{BOS}{}", c.system);
    for turn in &c.turns {
        match turn {
            Turn::User(parts) => {
                let mut blocks = Vec::with_capacity(parts.len());
                for part in parts {
                    blocks.push(match part {
                        Part::Text(t) => {
                            placeholder("the prompt", t)?;
                            *t
                        }
                        Part::Image => IMAGE_PLACEHOLDER,
                    });
                }
                out += USER;
                out += &blocks.join("\n\n");
            }
            Turn::Assistant(answer) => {
                placeholder("an assistant turn", answer)?;
                out += &format!("{ASSISTANT}{END_THINK}{answer}{EOS}");
            }
        }
    }
    out += ASSISTANT;
    out += END_THINK;
    Ok(out)
}

/// A checkpoint's tokenizer with the chat-prompt special tokens resolved.
pub struct ChatTokenizer {
    path: PathBuf,
    inner: Tokenizer,
    image_id: u32,
}

impl ChatTokenizer {
    /// Load `tokenizer.json` from a checkpoint directory.
    pub fn load(model_dir: &Path) -> Result<Self> {
        Self::from_file(&model_dir.join(TOKENIZER_FILE))
    }

    /// Load a tokenizer.json file and resolve the chat special tokens by name.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
        let inner =
            Tokenizer::from_str(&text).map_err(|e| Error::file(path, format!("not a valid tokenizer.json: {e}")))?;
        Self::new(inner, path)
    }

    /// The tokenizer of a GGUF's `tokenizer.ggml.*` keys ([`gguf::GgufVocab`]); `path` is the
    /// GGUF file, named in errors.
    /// The tokenizer of a model: a checkpoint directory's tokenizer.json, or a GGUF's
    /// `tokenizer.ggml.*` keys (see `crate::pipeline::is_gguf`).
    pub fn for_model(model: &Path) -> Result<Self> {
        if crate::pipeline::is_gguf(model) {
            let file = crate::weights::gguf::Gguf::open(model)?;
            return Self::from_gguf_vocab(&gguf::GgufVocab::from_gguf(&file)?, model);
        }
        Self::load(model)
    }

    pub fn from_gguf_vocab(vocab: &gguf::GgufVocab, path: &Path) -> Result<Self> {
        let inner = vocab.to_tokenizer().map_err(|e| Error::file(path, e.to_string()))?;
        Self::new(inner, path)
    }

    /// Resolve the chat special tokens by name.
    fn new(inner: Tokenizer, path: &Path) -> Result<Self> {
        let added = inner.get_added_vocabulary();
        let resolve = |name: &str| {
            added
                .token_to_id(name, inner.get_model())
                .filter(|_| added.is_special_token(name))
                .ok_or_else(|| Error::file(path, format!("special token {name} is not an added special token")))
        };
        for name in CHAT_SPECIAL_TOKENS {
            resolve(name)?;
        }
        let image_id = resolve(IMAGE_PLACEHOLDER)?;
        Ok(ChatTokenizer { path: path.to_path_buf(), inner, image_id })
    }

    /// Render the chat prompt and encode it (no special tokens added beyond the rendered ones);
    /// each image placeholder becomes [`PromptToken::Image`].
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> Result<Vec<PromptToken>> {
        self.encode_conversation(&Conversation::from(prompt))
    }

    /// [`ChatTokenizer::encode_chat`] of a conversation ([`render_conversation`]).
    pub fn encode_conversation(&self, c: &Conversation) -> Result<Vec<PromptToken>> {
        if c.turns.iter().any(|t| matches!(t, Turn::Assistant(_))) && !self.has_special(EOS) {
            return Err(Error::file(
                &self.path,
                format!("special token {EOS} (it ends an earlier assistant turn) is not an added special token"),
            ));
        }
        let text = render_conversation(c)?;
        let enc = self.inner.encode(text, false).map_err(|e| Error::file(&self.path, format!("encoding: {e}")))?;
        Ok(enc
            .get_ids()
            .iter()
            .map(|&id| if id == self.image_id { PromptToken::Image } else { PromptToken::Id(id) })
            .collect())
    }

    /// Whether `name` is one added special token (so the encoder keeps it whole).
    fn has_special(&self, name: &str) -> bool {
        let added = self.inner.get_added_vocabulary();
        added.is_special_token(name) && added.token_to_id(name, self.inner.get_model()).is_some()
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| Error::file(&self.path, format!("decoding: {e}")))
    }

    /// A streaming detokenizer over this tokenizer.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream { tok: self, stream: self.inner.decode_stream(true), ids: Vec::new(), shown: String::new() }
    }
}

type HfDecodeStream<'t> =
    DecodeStream<'t, ModelWrapper, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// Fed generated ids one at a time, yields new text as soon as it is complete UTF-8: a character
/// whose bytes are split over several byte-level tokens waits for its last byte. Special tokens
/// add nothing. The pieces, followed by [`TextStream::finish`], concatenate to
/// [`ChatTokenizer::decode`] of all the ids.
pub struct TextStream<'t> {
    tok: &'t ChatTokenizer,
    /// `tokenizers`' own stream: it holds text back while the decode ends in U+FFFD.
    stream: HfDecodeStream<'t>,
    ids: Vec<u32>,
    /// The concatenation of the pieces returned so far.
    shown: String,
}

impl TextStream<'_> {
    /// Add one id; the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let piece = self
            .stream
            .step(id)
            .map_err(|e| Error::file(&self.tok.path, format!("stream-decoding token {id}: {e}")))?;
        if let Some(p) = &piece {
            self.shown.push_str(p);
        }
        Ok(piece)
    }

    /// The text still held back at the end of the stream: bytes of a character that never
    /// completed, which a full decode shows as U+FFFD.
    pub fn finish(self) -> Result<String> {
        let full = self.tok.decode(&self.ids)?;
        full.strip_prefix(self.shown.as_str()).map(str::to_string).ok_or_else(|| {
            Error::file(
                &self.tok.path,
                format!("the streamed text {:?} is not a prefix of the full decode {full:?}", self.shown),
            )
        })
    }
}
