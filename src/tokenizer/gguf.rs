//! A GGUF's `tokenizer.ggml.*` key-values → an HF `tokenizers` tokenizer, so a GGUF checkpoint
//! runs with `--prompt` and no tokenizer.json. Takes the key values themselves (whatever read
//! the GGUF), refuses unknown `tokenizer.ggml.model` / `tokenizer.ggml.pre` by name.
//!
//! The result is what the checkpoint's tokenizer.json describes: a byte-level BPE (`"gpt2"`)
//! over `tokens` and `merges`, the pre-tokenizer `pre` names (llama.cpp's `llama-vocab.cpp`
//! regex list for that name, as an HF `Split` sequence followed by a regex-free ByteLevel), a
//! ByteLevel decoder, and the CONTROL / USER_DEFINED token types as added special / ordinary
//! tokens.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result};

/// llama.cpp's token types (`llama_token_type`): the ones that become added tokens.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The only `tokenizer.ggml.model` DeepSeek's vocabulary uses: byte-level BPE.
pub const MODEL_GPT2: &str = "gpt2";

/// `tokenizer.ggml.pre` names implemented, with their split regexes in order. "deepseek-v3" is
/// what llama.cpp's converter writes for DeepSeek-V3 and V4 (llama-vocab.cpp,
/// LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM), the same three splits as V4's tokenizer.json.
const PRE_TOKENIZERS: [(&str, &[&str]); 1] = [(
    "deepseek-v3",
    &[
        r"\p{N}{1,3}",
        "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
        r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
    ],
)];

/// The `tokenizer.ggml.*` key-values of a GGUF, as read from its header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`
    pub model: String,
    /// `tokenizer.ggml.pre`
    pub pre: String,
    /// `tokenizer.ggml.tokens`: token text by id (byte-level alphabet, as in tokenizer.json).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token.
    pub token_type: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: when true, encoding with special tokens prepends BOS.
    pub add_bos_token: Option<bool>,
}

fn key(k: &str) -> String {
    format!("tokenizer.ggml.{k}")
}

impl GgufVocab {
    /// The special token id under `k`, checked against the vocabulary.
    fn id(&self, k: &str, id: Option<u32>) -> Result<Option<&str>> {
        match id {
            None => Ok(None),
            Some(i) => self
                .tokens
                .get(i as usize)
                .map(|t| Some(t.as_str()))
                .ok_or_else(|| Error::config(key(k), format!("id {i} is outside the {} tokens", self.tokens.len()))),
        }
    }

    /// Build the tokenizer. Refuses (naming the key) an unknown model or pre-tokenizer, token
    /// types that do not match the tokens, a merge that is not two tokens of the vocabulary,
    /// duplicate tokens, and special ids outside the vocabulary.
    pub fn to_tokenizer(&self) -> Result<Tokenizer> {
        if self.model != MODEL_GPT2 {
            return Err(Error::config(
                key("model"),
                format!("{:?} is not supported (only {MODEL_GPT2:?}, byte-level BPE)", self.model),
            ));
        }
        let Some((_, regexes)) = PRE_TOKENIZERS.iter().find(|(name, _)| *name == self.pre) else {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|(n, _)| *n).collect();
            return Err(Error::config(
                key("pre"),
                format!("pre-tokenizer {:?} is not supported (known: {})", self.pre, known.join(", ")),
            ));
        };
        if self.token_type.len() != self.tokens.len() {
            return Err(Error::config(
                key("token_type"),
                format!("{} entries for {} tokens", self.token_type.len(), self.tokens.len()),
            ));
        }
        let n = u32::try_from(self.tokens.len())
            .map_err(|_| Error::config(key("tokens"), format!("{} tokens do not fit u32 ids", self.tokens.len())))?;
        let mut vocab = Vocab::with_capacity(self.tokens.len());
        for (id, t) in (0..n).zip(&self.tokens) {
            if let Some(prev) = vocab.insert(t.clone(), id) {
                return Err(Error::config(key("tokens"), format!("token {t:?} appears twice (ids {prev} and {id})")));
            }
        }
        let mut merges = Vec::with_capacity(self.merges.len());
        for (i, m) in self.merges.iter().enumerate() {
            let pair = m.split_once(' ').filter(|(a, b)| vocab.contains_key(*a) && vocab.contains_key(*b));
            let (a, b) = pair.ok_or_else(|| {
                Error::config(key("merges"), format!("merge {i} ({m:?}) is not two tokens of the vocabulary"))
            })?;
            merges.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| Error::config(key("merges"), format!("not a valid BPE: {e}")))?;
        let mut pre = Vec::with_capacity(regexes.len() + 1);
        for r in *regexes {
            let split = Split::new(SplitPattern::Regex(r.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| Error::config(key("pre"), format!("regex {r:?}: {e}")))?;
            pre.push(PreTokenizerWrapper::Split(split));
        }
        // the splits did the regex work: ByteLevel only maps bytes to its alphabet
        pre.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)));
        let mut tok = Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(Sequence::new(pre)));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        let added = |ty: i32| self.tokens.iter().zip(&self.token_type).filter(move |(_, t)| **t == ty);
        let special: Vec<AddedToken> =
            added(TOKEN_TYPE_CONTROL).map(|(t, _)| AddedToken::from(t.clone(), true)).collect();
        let user: Vec<AddedToken> =
            added(TOKEN_TYPE_USER_DEFINED).map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false)).collect();
        tok.add_special_tokens(special)
            .map_err(|e| Error::config(key("token_type"), format!("adding the CONTROL tokens: {e}")))?;
        tok.add_tokens(user)
            .map_err(|e| Error::config(key("token_type"), format!("adding the USER_DEFINED tokens: {e}")))?;
        let bos = self.id("bos_token_id", self.bos_token_id)?;
        self.id("eos_token_id", self.eos_token_id)?;
        self.id("padding_token_id", self.padding_token_id)?;
        if self.add_bos_token == Some(true) {
            let bos = bos.ok_or_else(|| Error::config(key("add_bos_token"), "true, but there is no bos_token_id"))?;
            let id = self.bos_token_id.unwrap_or_default();
            let post = TemplateProcessing::builder()
                .try_single(format!("{bos} $A"))
                .and_then(|b| b.try_pair(format!("{bos} $A {bos} $B")))
                .map_err(|e| Error::config(key("add_bos_token"), format!("template: {e}")))?
                .special_tokens(vec![(bos.to_string(), id)])
                .build()
                .map_err(|e| Error::config(key("add_bos_token"), format!("template: {e}")))?;
            tok.with_post_processor(Some(post));
        }
        Ok(tok)
    }
}

impl GgufVocab {
    /// The `tokenizer.ggml.*` keys of an opened GGUF. A missing required key, or one of the wrong
    /// type, is refused naming the key and the file.
    pub fn from_gguf(file: &crate::weights::gguf::Gguf) -> Result<GgufVocab> {
        use crate::weights::gguf::Value;
        let path = file.files().first().map(|p| p.display().to_string()).unwrap_or_default();
        let bad = |k: &str, what: &str| Error::config(key(k), format!("{path}: {what}"));
        let string = |k: &str| -> Result<String> {
            file.kv(&key(k))
                .and_then(|v| v.as_str().map(str::to_string))
                .ok_or_else(|| bad(k, "missing or not a string"))
        };
        let strings = |k: &str| -> Result<Vec<String>> {
            let arr = file.kv(&key(k)).and_then(|v| v.as_array()).ok_or_else(|| bad(k, "missing or not an array"))?;
            arr.iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(k, "an element is not a string")))
                .collect()
        };
        let id = |k: &str| -> Result<Option<u32>> {
            match file.kv(&key(k)) {
                None => Ok(None),
                Some(v) => {
                    v.as_int().and_then(|i| u32::try_from(i).ok()).map(Some).ok_or_else(|| bad(k, "not a token id"))
                }
            }
        };
        let token_type = match file.kv(&key("token_type")) {
            None => Vec::new(),
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| bad("token_type", "not an array"))?;
                arr.iter()
                    .map(|v: Value<'_>| v.as_int().and_then(|i| i32::try_from(i).ok()))
                    .collect::<Option<Vec<i32>>>()
                    .ok_or_else(|| bad("token_type", "an element is not an i32"))?
            }
        };
        let add_bos_token = match file.kv(&key("add_bos_token")) {
            None => None,
            Some(v) => Some(v.as_bool().ok_or_else(|| bad("add_bos_token", "not a bool"))?),
        };
        Ok(GgufVocab {
            model: string("model")?,
            pre: string("pre")?,
            tokens: strings("tokens")?,
            token_type,
            merges: if file.kv(&key("merges")).is_some() { strings("merges")? } else { Vec::new() },
            bos_token_id: id("bos_token_id")?,
            eos_token_id: id("eos_token_id")?,
            padding_token_id: id("padding_token_id")?,
            add_bos_token,
        })
    }
}
