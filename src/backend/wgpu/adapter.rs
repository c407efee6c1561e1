//! Finding the adapter: the machine's adapters, the one a name picks (else the best kind), and
//! the precision the command line gives it by default.

use std::sync::Mutex;

use crate::backend::Precision;
use crate::error::{Error, Result};

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        _ => 3,
    }
}

pub(super) fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

/// Names of the adapters wgpu finds on this machine (for error messages and `--list`).
pub fn list_adapters() -> Vec<String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| describe(&a.get_info()))
        .collect()
}

/// One device creation at a time in this process (driver creation paths are not all thread-safe
/// against each other).
pub(super) static DEVICE_CREATION: Mutex<()> = Mutex::new(());

/// The first adapter whose name contains `name` (case-insensitive), else the best one (discrete >
/// integrated > virtual > CPU such as lavapipe).
pub(super) fn select_adapter(name: Option<&str>) -> Result<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if adapters.is_empty() {
        return Err(Error::Device(
            "no wgpu adapter found; install a Vulkan driver or Mesa lavapipe (mesa-vulkan-drivers)".into(),
        ));
    }
    match name {
        Some(want) => {
            let w = want.to_lowercase();
            match adapters.iter().find(|a| a.get_info().name.to_lowercase().contains(&w)) {
                Some(a) => Ok(a.clone()),
                None => {
                    let found: Vec<String> = adapters.iter().map(|a| describe(&a.get_info())).collect();
                    Err(Error::Device(format!("no wgpu adapter name contains `{want}`; found: {}", found.join(", "))))
                }
            }
        }
        None => Ok(adapters.iter().min_by_key(|a| type_rank(a.get_info().device_type)).unwrap().clone()),
    }
}

/// The precision the command line runs an adapter in when none is asked for: fast on a GPU with
/// SHADER_F16 (the default for GPU lanes), exact on a software adapter (lavapipe,
/// SwiftShader: the conformance device of CI, where f16 operands buy no speed) and on one
/// without SHADER_F16 (which cannot run fast).
pub fn default_precision(info: &wgpu::AdapterInfo, features: wgpu::Features) -> Precision {
    if info.device_type != wgpu::DeviceType::Cpu && features.contains(wgpu::Features::SHADER_F16) {
        Precision::Fast
    } else {
        Precision::Exact
    }
}
