//! fovea: runs DeepSeek-V4-Flash-Vision on a CPU reference lane and a wgpu lane (Vulkan, Metal,
//! DX12, or Mesa lavapipe); a native CUDA lane comes later.
//!
//! Data flows one way: file → weights → device tensors → graph → outputs.
//! - [`config`]: config.json → typed, validated config (errors name the key)
//! - [`weights`]: safetensors (mmap, shards) and the tensor accounting
//! - [`processor`]: image decode, Pillow-exact resize/pad, size solver, N-layout block
//! - [`tokenizer`]: tokenizer.json, the chat prompt, streamed text output
//! - [`formats`]: weight storage formats (float and block-quantised) and their reference decoders
//! - [`backend`]: the `Backend` contract and its lanes
//! - [`progress`]: the load progress bar on stderr
//! - [`model`]: the graph, written once against `Backend`
//! - [`serve`]: `fovea serve`, the OpenAI-compatible HTTP server

pub mod backend;
pub mod config;
pub mod error;
pub mod formats;
pub mod model;
pub mod pipeline;
pub mod processor;
pub mod progress;
pub mod serve;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
