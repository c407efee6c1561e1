//! The tokenizer against Python HF `tokenizers` 0.23.3 goldens
//! (`fixtures/gen/tokenizer/make_tokenizer.py` → `fixtures/goldens/tokenizer/lm-tiny.json`):
//! the chat prompt of vision.md §2.4 renders to the same string and encodes to the same ids,
//! and the streaming detokenizer reproduces Python's decode exactly. All comparisons are exact
//! (strings and integer ids: there is no tolerance to derive).

mod common;

use std::path::PathBuf;

use fovea::pipeline::PromptToken;
use fovea::tokenizer::{
    ChatPrompt, ChatTokenizer, Conversation, IMAGE_PLACEHOLDER, Part, Turn, render_chat, render_conversation,
};
use serde_json::Value;

fn golden() -> Value {
    let path = common::root().join("fixtures/goldens/tokenizer/lm-tiny.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn lm_tiny_tokenizer() -> ChatTokenizer {
    ChatTokenizer::load(&common::model_dir("lm-tiny")).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn chat_prompts_render_and_encode_like_python() {
    let g = golden();
    let tok = lm_tiny_tokenizer();
    let image_id = g["special_tokens"][IMAGE_PLACEHOLDER].as_u64().unwrap() as u32;
    let cases = g["chat"].as_array().unwrap();
    assert!(cases.len() >= 5);
    let mut n_with_images = 0;
    for case in cases {
        let prompt = ChatPrompt {
            system: case["system"].as_str().unwrap(),
            question: case["question"].as_str().unwrap(),
            n_images: case["n_images"].as_u64().unwrap() as usize,
        };
        n_with_images += usize::from(prompt.n_images > 0);
        assert_eq!(render_chat(&prompt).unwrap(), case["rendered"].as_str().unwrap(), "{prompt:?}");
        let want: Vec<PromptToken> = u32s(&case["ids"])
            .into_iter()
            .map(|id| if id == image_id { PromptToken::Image } else { PromptToken::Id(id) })
            .collect();
        let got = tok.encode_chat(&prompt).unwrap();
        assert_eq!(got, want, "{prompt:?}");
        assert_eq!(got.iter().filter(|t| **t == PromptToken::Image).count(), prompt.n_images);
    }
    assert!(n_with_images >= 2, "the goldens cover image prompts");
}

#[test]
fn streamed_text_equals_the_python_decode() {
    let g = golden();
    let tok = lm_tiny_tokenizer();
    let mut held_back = 0;
    for case in g["decode"].as_array().unwrap() {
        let note = case["note"].as_str().unwrap();
        let ids = u32s(&case["ids"]);
        let want = case["text"].as_str().unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), want, "{note}");
        let prefixes: Vec<&str> =
            case["prefix_texts"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let mut stream = tok.stream();
        let mut shown = String::new();
        for (k, &id) in ids.iter().enumerate() {
            if let Some(piece) = stream.push(id).unwrap() {
                assert!(!piece.is_empty(), "{note}: empty piece after id {k}");
                shown += &piece;
            }
            // never shows text that a longer decode could still change, and shows all of the
            // decode as soon as it does not end in a replacement character
            let python = prefixes[k + 1];
            assert!(python.starts_with(&shown), "{note}: after {} ids shows {shown:?}, Python {python:?}", k + 1);
            if python.ends_with('\u{FFFD}') {
                held_back += 1;
            } else {
                assert_eq!(shown, python, "{note}: after {} ids", k + 1);
            }
        }
        shown += &stream.finish().unwrap();
        assert_eq!(shown, want, "{note}: pieces + finish");
    }
    assert!(held_back >= 5, "the goldens split characters over several tokens ({held_back} held-back steps)");
}

/// A copy of lm-tiny's tokenizer.json with `edit` applied to its JSON.
fn edited_tokenizer(edit: impl FnOnce(&mut Value)) -> (tempfile::TempDir, PathBuf) {
    let src = common::model_dir("lm-tiny").join("tokenizer.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut json);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), serde_json::to_string(&json).unwrap()).unwrap();
    let path = dir.path().to_path_buf();
    (dir, path)
}

#[test]
fn load_errors_name_the_file_or_the_token() {
    let empty = tempfile::tempdir().unwrap();
    let e = ChatTokenizer::load(empty.path()).err().expect("no tokenizer.json").to_string();
    assert!(e.contains("tokenizer.json") && e.contains("cannot read"), "{e}");

    let bad = tempfile::tempdir().unwrap();
    std::fs::write(bad.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = ChatTokenizer::load(bad.path()).err().expect("invalid tokenizer.json").to_string();
    assert!(e.contains("tokenizer.json") && e.contains("not a valid tokenizer.json"), "{e}");

    for name in ["<｜User｜>", IMAGE_PLACEHOLDER] {
        // the token removed from the added tokens
        let (_keep, dir) = edited_tokenizer(|j| {
            j["added_tokens"].as_array_mut().unwrap().retain(|t| t["content"] != name);
        });
        let e = ChatTokenizer::load(&dir).err().expect("missing special token").to_string();
        assert!(e.contains("tokenizer.json") && e.contains(name), "{e}");
        // the token present but not special
        let (_keep, dir) = edited_tokenizer(|j| {
            for t in j["added_tokens"].as_array_mut().unwrap() {
                if t["content"] == name {
                    t["special"] = Value::Bool(false);
                }
            }
        });
        let e = ChatTokenizer::load(&dir).err().expect("non-special token").to_string();
        assert!(e.contains(name) && e.contains("not an added special token"), "{e}");
    }
}

#[test]
fn a_typed_image_placeholder_is_rejected() {
    let tok = lm_tiny_tokenizer();
    let typed = format!("look: {IMAGE_PLACEHOLDER} here");
    for prompt in [
        ChatPrompt { question: &typed, n_images: 1, ..Default::default() },
        ChatPrompt { system: &typed, question: "hi", n_images: 0 },
    ] {
        let e = tok.encode_chat(&prompt).err().expect("placeholder typed as text").to_string();
        assert!(e.contains(IMAGE_PLACEHOLDER) && e.contains("--image"), "{e}");
    }
    // other special-token text is the tokenizer's business (it matches them), not an error
    assert!(tok.encode_chat(&ChatPrompt { question: "<think>", ..Default::default() }).is_ok());
}

/// Several turns (the server's messages): earlier answers close with the end-of-sentence token,
/// a user turn's text and images keep their order, and one user turn with images first renders
/// as `render_chat` does.
#[test]
fn conversations_render_turn_by_turn() {
    let c = Conversation {
        system: "Be brief.",
        turns: vec![
            Turn::User(vec![Part::Text("What is this?"), Part::Image]),
            Turn::Assistant("A cat."),
            Turn::User(vec![Part::Text("And its colour?")]),
        ],
    };
    let want = format!(
        "<｜begin▁of▁sentence｜>Be brief.<｜User｜>What is this?\n\n{IMAGE_PLACEHOLDER}<｜Assistant｜></think>A cat.\
         <｜end▁of▁sentence｜><｜User｜>And its colour?<｜Assistant｜></think>"
    );
    assert_eq!(render_conversation(&c).unwrap(), want);
    let tok = lm_tiny_tokenizer();
    let ids = tok.encode_conversation(&c).unwrap();
    assert_eq!(ids.iter().filter(|t| **t == PromptToken::Image).count(), 1);
    // the end-of-sentence token stays one special token (lm-tiny's EOS is id 1)
    assert_eq!(ids.iter().filter(|t| **t == PromptToken::Id(1)).count(), 1);

    let one = ChatPrompt { system: "", question: "Describe this image.", n_images: 1 };
    let as_turn = Conversation { system: "", turns: vec![Turn::User(vec![Part::Image, Part::Text(one.question)])] };
    assert_eq!(render_conversation(&as_turn).unwrap(), render_chat(&one).unwrap());

    let ends_with_answer = Conversation { system: "", turns: vec![Turn::Assistant("hi")] };
    let e = render_conversation(&ends_with_answer).unwrap_err().to_string();
    assert!(e.contains("must end with a user turn"), "{e}");
}
