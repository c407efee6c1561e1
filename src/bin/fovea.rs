fn main() { eprintln!("fovea: the CLI lands with the pipeline"); }
