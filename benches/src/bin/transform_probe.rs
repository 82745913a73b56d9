//! Applies a transform pipeline to one image for several sample indices, writes each output
//! as a PNG and prints, one JSON line per index, what each transform drew. The parity test
//! `benches/python/test_transforms_parity.py` replays those parameters with torchvision.
//!
//! ```text
//! transform_probe --transform 'RandomCrop(64, padding=4)' --input photo.png \
//!     --out-dir /tmp/probe --indices 16 [--seed 0] [--epoch 0]
//! ```
//!
//! Output lines: `{"index": 3, "output": "/tmp/probe/3.png", "drawn": [{"transform":
//! "RandomCrop", "padding": [4, 4, 4, 4], "pad_if_needed": [0, 0], "top": 7, "left": 2}]}`.

use std::error::Error;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use ladle_datasets::decode::Decoder;
use ladle_datasets::transforms::{Drawn, Transformer, Transforms};

/// One line of output.
#[derive(serde::Serialize)]
struct Line<'a> {
    index: u64,
    output: &'a Path,
    drawn: Vec<Drawn>,
}

struct Args {
    transform: String,
    input: PathBuf,
    out_dir: PathBuf,
    indices: u64,
    seed: u64,
    epoch: u64,
}

const USAGE: &str = "usage: transform_probe --transform SPEC --input IMAGE --out-dir DIR \
                     [--indices N] [--seed S] [--epoch E]";

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut transform = None;
    let mut input = None;
    let mut out_dir = None;
    let (mut indices, mut seed, mut epoch) = (1, 0, 0);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--transform" => transform = Some(value()?),
            "--input" => input = Some(PathBuf::from(value()?)),
            "--out-dir" => out_dir = Some(PathBuf::from(value()?)),
            "--indices" => indices = value()?.parse()?,
            "--seed" => seed = value()?.parse()?,
            "--epoch" => epoch = value()?.parse()?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }
    let missing = |what: &str| format!("missing {what}\n{USAGE}");
    Ok(Args {
        transform: transform.ok_or_else(|| missing("--transform"))?,
        input: input.ok_or_else(|| missing("--input"))?,
        out_dir: out_dir.ok_or_else(|| missing("--out-dir"))?,
        indices,
        seed,
        epoch,
    })
}

fn write_png(path: &Path, side: u32, pixels: &[u8]) -> Result<(), Box<dyn Error>> {
    let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), side, side);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(pixels)?;
    writer.finish()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let transforms = Transforms::parse(&args.transform)?;
    let bytes = std::fs::read(&args.input).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let mut decoder = Decoder::new();
    let image = decoder
        .decode(&bytes)
        .map_err(|e| format!("{}: {e}", args.input.display()))?;
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| format!("{}: {e}", args.out_dir.display()))?;
    let side = transforms.size();
    let mut out = vec![0u8; transforms.output_len()];
    let mut transformer = Transformer::new(transforms);
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    for index in 0..args.indices {
        let drawn = transformer.apply_traced(image, args.seed, args.epoch, index, &mut out)?;
        let output = args.out_dir.join(format!("{index}.png"));
        write_png(&output, side, &out)?;
        let line = Line {
            index,
            output: &output,
            drawn,
        };
        writeln!(stdout, "{}", serde_json::to_string(&line)?)?;
    }
    Ok(())
}
