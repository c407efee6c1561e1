//! The tokenizer built from GGUF `tokenizer.ggml.*` key-values (`tokenizer::gguf`) against the
//! HF goldens. The key-values come from llama.cpp's own gguf-py (`SpecialVocab` for merges and
//! special ids) and its converter's vocabulary rules, written by
//! `fixtures/gen/tokenizer/make_gguf_vocab.py` from the fixtures' tokenizer.json files; the ids
//! and texts they must reproduce come from Python HF `tokenizers` 0.23.3
//! (`fixtures/goldens/tokenizer/lm-tiny.json`). All comparisons are exact.

mod common;

use fovea::pipeline::PromptToken;
use fovea::tokenizer::gguf::GgufVocab;
use fovea::tokenizer::{ChatPrompt, ChatTokenizer, IMAGE_PLACEHOLDER};
use serde_json::Value;

fn json(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::root().join(rel)).unwrap()).unwrap()
}

/// The key-values of one model as a [`GgufVocab`].
fn vocab(model: &str) -> GgufVocab {
    let kv = json(&format!("fixtures/gen/tokenizer/gguf_vocab/{model}.json"));
    let strings = |k: &str| -> Vec<String> {
        kv[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    let id = |k: &str| kv.get(k).and_then(Value::as_u64).map(|v| v as u32);
    GgufVocab {
        model: kv["tokenizer.ggml.model"].as_str().unwrap().to_string(),
        pre: kv["tokenizer.ggml.pre"].as_str().unwrap().to_string(),
        tokens: strings("tokenizer.ggml.tokens"),
        token_type: kv["tokenizer.ggml.token_type"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect(),
        merges: strings("tokenizer.ggml.merges"),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        eos_token_id: id("tokenizer.ggml.eos_token_id"),
        padding_token_id: id("tokenizer.ggml.padding_token_id"),
        add_bos_token: kv.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool),
    }
}

fn gguf_tokenizer(model: &str) -> ChatTokenizer {
    ChatTokenizer::from_gguf_vocab(&vocab(model), std::path::Path::new(&format!("{model}.gguf"))).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn prompt(case: &Value) -> ChatPrompt<'_> {
    ChatPrompt {
        system: case["system"].as_str().unwrap(),
        question: case["question"].as_str().unwrap(),
        n_images: case["n_images"].as_u64().unwrap() as usize,
    }
}

#[test]
fn gguf_keys_encode_and_decode_the_lm_tiny_goldens_exactly() {
    let g = json("fixtures/goldens/tokenizer/lm-tiny.json");
    let tok = gguf_tokenizer("lm-tiny");
    let image_id = g["special_tokens"][IMAGE_PLACEHOLDER].as_u64().unwrap() as u32;
    let cases = g["chat"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let p = prompt(case);
        let want: Vec<PromptToken> = u32s(&case["ids"])
            .into_iter()
            .map(|id| if id == image_id { PromptToken::Image } else { PromptToken::Id(id) })
            .collect();
        assert_eq!(tok.encode_chat(&p).unwrap(), want, "{p:?}");
    }
    for case in g["decode"].as_array().unwrap() {
        assert_eq!(tok.decode(&u32s(&case["ids"])).unwrap(), case["text"].as_str().unwrap(), "{}", case["note"]);
    }
}

/// vl-scenes has no Python goldens of its own: its tokenizer.json (through the same HF crate)
/// is the reference, on the lm-tiny golden prompts and their decodes.
#[test]
fn gguf_keys_match_the_vl_scenes_tokenizer_json() {
    let g = json("fixtures/goldens/tokenizer/lm-tiny.json");
    let from_gguf = gguf_tokenizer("vl-scenes");
    let from_json = ChatTokenizer::load(&common::model_dir("vl-scenes")).unwrap();
    for case in g["chat"].as_array().unwrap() {
        let p = prompt(case);
        let ids = from_json.encode_chat(&p).unwrap();
        assert_eq!(from_gguf.encode_chat(&p).unwrap(), ids, "{p:?}");
        let plain: Vec<u32> =
            ids.iter().filter_map(|t| if let PromptToken::Id(i) = t { Some(*i) } else { None }).collect();
        assert_eq!(from_gguf.decode(&plain).unwrap(), from_json.decode(&plain).unwrap(), "{p:?}");
    }
}

#[test]
fn unknown_model_and_pre_tokenizer_are_refused_by_name() {
    let mut v = vocab("lm-tiny");
    v.model = "llama".into();
    let e = v.to_tokenizer().unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.model") && e.contains("llama"), "{e}");
    let mut v = vocab("lm-tiny");
    v.pre = "qwen2".into();
    let e = v.to_tokenizer().unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.pre") && e.contains("qwen2") && e.contains("deepseek-v3"), "{e}");
    // the GGUF file is named when the chat tokenizer is built from it
    let e = ChatTokenizer::from_gguf_vocab(&v, std::path::Path::new("x.gguf")).err().unwrap().to_string();
    assert!(e.contains("x.gguf"), "{e}");
}

#[test]
fn inconsistent_keys_are_refused_by_name() {
    let mut v = vocab("lm-tiny");
    v.token_type.pop();
    assert!(v.to_tokenizer().unwrap_err().to_string().contains("tokenizer.ggml.token_type"));
    let mut v = vocab("lm-tiny");
    v.merges.push("nosuchtoken Ġ".into());
    assert!(v.to_tokenizer().unwrap_err().to_string().contains("tokenizer.ggml.merges"));
    let mut v = vocab("lm-tiny");
    v.bos_token_id = Some(100_000);
    assert!(v.to_tokenizer().unwrap_err().to_string().contains("tokenizer.ggml.bos_token_id"));
    let mut v = vocab("lm-tiny");
    let dup = v.tokens[9].clone();
    v.tokens[10] = dup;
    assert!(v.to_tokenizer().unwrap_err().to_string().contains("appears twice"));
}

#[test]
fn add_bos_token_prepends_bos_when_special_tokens_are_added() {
    let mut v = vocab("lm-tiny");
    let plain = v.to_tokenizer().unwrap().encode("The cat", true).unwrap().get_ids().to_vec();
    v.add_bos_token = Some(true);
    let with_bos = v.to_tokenizer().unwrap().encode("The cat", true).unwrap().get_ids().to_vec();
    let bos = v.bos_token_id.unwrap();
    assert_eq!(with_bos, [&[bos][..], &plain[..]].concat());
    v.bos_token_id = None;
    assert!(v.to_tokenizer().unwrap_err().to_string().contains("tokenizer.ggml.add_bos_token"));
}

/// The keys as llama.cpp's converter wrote them into real GGUF files (read by our GGUF reader):
/// the shipped model's pair and the tiny real-format model each encode and decode the golden
/// prompts exactly as their HF tokenizer.json does.
#[test]
fn tokenizer_keys_of_converted_gguf_files_match_their_tokenizer_json() {
    let g = json("fixtures/goldens/tokenizer/lm-tiny.json");
    for (gguf, dir) in [
        ("fixtures/models/vl-scenes-gguf/text-Q8_0.gguf", "vl-scenes"),
        ("fixtures/models/vl-real-tiny-gguf/text-MXFP4_MOE.gguf", "vl-real-tiny"),
    ] {
        let path = common::root().join(gguf);
        let file = fovea::weights::gguf::Gguf::open(&path).unwrap();
        let from_gguf = ChatTokenizer::from_gguf_vocab(&GgufVocab::from_gguf(&file).unwrap(), &path).unwrap();
        let from_json = ChatTokenizer::load(&common::model_dir(dir)).unwrap();
        for case in g["chat"].as_array().unwrap() {
            let p = prompt(case);
            let ids = from_json.encode_chat(&p).unwrap();
            assert_eq!(from_gguf.encode_chat(&p).unwrap(), ids, "{gguf}: {p:?}");
            let plain: Vec<u32> =
                ids.iter().filter_map(|t| if let PromptToken::Id(i) = t { Some(*i) } else { None }).collect();
            assert_eq!(from_gguf.decode(&plain).unwrap(), from_json.decode(&plain).unwrap(), "{gguf}: {p:?}");
        }
    }
}
