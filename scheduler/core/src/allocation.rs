//! Which of a node's GPUs a daemon may use: the GPUs a Slurm allocation, a
//! `CUDA_VISIBLE_DEVICES` (or a person, with `ladle scheduler --only-gpus`) gives it, as
//! [`GpuSelector`]s, and [`given_gpus`] / [`allocation_from_env`], which read them from the
//! environment.
//!
//! The daemon never reads the environment itself (its `DaemonConfig::allocated`, in
//! `ladle-scheduler`, is its caller's choice): `ladle scheduler` and `ladle sweep` call
//! [`given_gpus`] unless `--only-gpus` is given, a node of `ladle sweep --slurm`
//! [`allocation_from_env`].
//!
//! ## Naming a GPU
//! - [`GpuSelector::Uuid`]: `GPU-…`, one GPU on any machine and under any renumbering.
//! - [`GpuSelector::Index`]: the GPU's device-file number, `N` of `/dev/nvidiaN` (NVML's
//!   *minor number*). That is what Slurm's gres names GPUs by: `SLURM_JOB_GPUS` and
//!   `SLURM_STEP_GPUS` hold the indices of the gres `File=` devices (`/dev/nvidia[0-3]`), on
//!   the node, never renumbered. It is not NVML's index (PCI bus order) nor CUDA's (fastest
//!   first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`), though the three usually agree.
//!
//! ## Where [`allocation_from_env`] looks, and why in this order
//! 1. `CUDA_VISIBLE_DEVICES` holding UUIDs (`GPU-…`) wins: a UUID is unambiguous whoever set
//!    it. MIG instances (`MIG-…`) are an error: ladle schedules whole GPUs.
//! 2. Else `SLURM_STEP_GPUS`, then `SLURM_JOB_GPUS` (a step may hold a subset of its job's
//!    GPUs): comma-separated node-level indices, as above.
//! 3. Else, inside a Slurm job (`SLURM_JOB_ID` set), an error: a numeric
//!    `CUDA_VISIBLE_DEVICES` is **not** used there, because a site that constrains devices
//!    (cgroup `ConstrainDevices=yes`) renumbers it from 0 inside the job, so `0` may be the
//!    node's GPU 3; taking it for node indices would schedule GPUs the job does not hold.
//!    Asking Slurm for GPUs as gres (`--gres=gpu:N`, `--gpus-per-node=N`) sets
//!    `SLURM_JOB_GPUS`.
//! 4. Outside Slurm, a numeric `CUDA_VISIBLE_DEVICES` (a workstation split between
//!    colleagues, a cloud box with a job beside): [`GpuSelector::CudaIndex`]es, CUDA's device
//!    numbers, which [`cuda_order`] maps onto the machine's GPUs. CUDA counts in PCI bus
//!    order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`; under its default (`FASTEST_FIRST`) it
//!    puts the fastest first and equals in PCI bus order, so ladle takes PCI bus order when
//!    every GPU is the same model and otherwise refuses, asking for `PCI_BUS_ID` or UUIDs
//!    (which GPU CUDA measures fastest is not something NVML says).
//! 5. Else `Ok(None)`: every GPU of the machine.
//!
//! A variable that is set but empty, Slurm's `NoDevFiles` (gres GPUs without a `File=`
//! device, so no index names them), or anything else that does not parse is an
//! [`AllocationError`] naming the variable and its value, never a silent "all GPUs".

use std::fmt;

/// One GPU of an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GpuSelector {
    /// The GPU whose device file is `/dev/nvidiaN` (NVML's minor number), as Slurm's
    /// `SLURM_JOB_GPUS` names it.
    Index(u32),
    /// The GPU with this UUID (`GPU-…`).
    Uuid(String),
    /// The `index`th GPU as CUDA counts them in the process that named it: an entry of a
    /// numeric `CUDA_VISIBLE_DEVICES` outside Slurm. Resolved by [`cuda_order`].
    CudaIndex {
        /// CUDA's device number.
        index: u32,
        /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` was set (else CUDA's default, `FASTEST_FIRST`).
        pci_bus_order: bool,
    },
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "/dev/nvidia{i}"),
            Self::Uuid(uuid) => f.write_str(uuid),
            Self::CudaIndex { index, .. } => write!(f, "CUDA device {index}"),
        }
    }
}

/// An allocation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocationError {
    /// A variable (or option) is set to something that names no GPU.
    #[error("{var}={value:?}: {why}")]
    Invalid {
        /// The variable or option, e.g. `SLURM_JOB_GPUS` or `--only-gpus`.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it and what to do.
        why: String,
    },
    /// MIG instances were given; ladle schedules whole GPUs.
    #[error(
        "{var}={value:?} names MIG instances: ladle schedules whole GPUs and does not place \
         jobs in MIG instances (ask Slurm for whole GPUs)"
    )]
    Mig {
        /// The variable or option.
        var: String,
        /// Its value.
        value: String,
    },
    /// Inside a Slurm job, nothing says which of the node's GPUs the job holds.
    #[error(
        "Slurm job {job_id}: neither SLURM_STEP_GPUS, SLURM_JOB_GPUS nor GPU UUIDs in \
         CUDA_VISIBLE_DEVICES (it is {cuda_visible_devices}) say which GPUs this job holds; a \
         numeric CUDA_VISIBLE_DEVICES is not used, as Slurm may have renumbered it from 0. \
         Ask for GPUs as gres (`--gres=gpu:N` or `--gpus-per-node=N`), or pass the GPUs \
         with `--only-gpus`"
    )]
    NoSlurmGpus {
        /// `SLURM_JOB_ID`.
        job_id: String,
        /// `CUDA_VISIBLE_DEVICES` as found, or `unset`.
        cuda_visible_devices: String,
    },
    /// A numeric `CUDA_VISIBLE_DEVICES` on a machine whose GPUs CUDA may order otherwise
    /// than by PCI bus.
    #[error(
        "CUDA_VISIBLE_DEVICES counts GPUs in CUDA's order, which on this machine of different \
         GPU models ({models}) is fastest first by CUDA's own measure, not known here: set \
         CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA then counts in PCI bus order, as nvidia-smi does), \
         or name the GPUs by UUID (nvidia-smi -L)"
    )]
    CudaOrderUnknown {
        /// The models, comma-joined.
        models: String,
    },
    /// A CUDA device number beyond the machine's GPUs.
    #[error("CUDA_VISIBLE_DEVICES names CUDA device {index}; this machine has {count} GPUs")]
    NoCudaDevice {
        /// The number.
        index: u32,
        /// GPUs there are.
        count: usize,
    },
    /// A device file or UUID that no GPU of this machine has.
    #[error("{gpu} is no GPU of this machine (it has {seen})")]
    NotOnMachine {
        /// The selector, as given.
        gpu: String,
        /// The machine's GPUs, `/dev/nvidiaN GPU-…`, comma-joined.
        seen: String,
    },
}

/// One GPU of the whole machine (every GPU NVML lists, whether or not a scheduler uses it),
/// as [`machine_uuids`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineGpu {
    /// Its device file's number (`/dev/nvidiaN`), when NVML says it.
    pub minor: Option<u32>,
    /// Its UUID.
    pub uuid: String,
    /// Its PCI bus id and model, for CUDA's numbering.
    pub pci: PciGpu,
}

/// The UUIDs of the machine's GPUs that `selectors` name, in their order: a device file by
/// its minor number, a UUID as itself, a CUDA device number through [`cuda_order`]. Used to
/// place a job's own `CUDA_VISIBLE_DEVICES` among a scheduler's GPUs.
///
/// # Errors
/// [`AllocationError::NotOnMachine`] for a device file or UUID no GPU has, and those of
/// [`resolve_cuda_indices`].
pub fn machine_uuids(
    selectors: &[GpuSelector],
    machine: &[MachineGpu],
) -> Result<Vec<String>, AllocationError> {
    let pci: Vec<PciGpu> = machine.iter().map(|g| g.pci.clone()).collect();
    let cuda = resolve_cuda_indices(selectors, &pci)?;
    (selectors.iter().zip(cuda))
        .map(|(selector, at)| {
            let found = match (selector, at) {
                (_, Some(at)) => Some(&machine[at]),
                (GpuSelector::Index(minor), None) => {
                    machine.iter().find(|g| g.minor == Some(*minor))
                }
                (GpuSelector::Uuid(uuid), None) => machine.iter().find(|g| &g.uuid == uuid),
                (GpuSelector::CudaIndex { .. }, None) => None,
            };
            found
                .map(|g| g.uuid.clone())
                .ok_or_else(|| AllocationError::NotOnMachine {
                    gpu: selector.to_string(),
                    seen: (machine.iter())
                        .map(|g| {
                            let file = g.minor.map_or_else(
                                || "(no device file)".to_owned(),
                                |m| format!("/dev/nvidia{m}"),
                            );
                            format!("{file} {}", g.uuid)
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        })
        .collect()
}

/// One GPU as [`cuda_order`] needs it: its PCI bus id (`00000000:3B:00.0`) and model name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciGpu {
    /// NVML's PCI bus id.
    pub bus_id: String,
    /// NVML's name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
}

/// The positions in `gpus` (NVML's list) of the GPUs CUDA numbers `0, 1, …`: by PCI bus id.
/// That is CUDA's order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`. Under CUDA's default,
/// `FASTEST_FIRST`, CUDA puts the GPUs it measures fastest first and orders equals by PCI
/// bus id: the same order when every GPU is the same model, otherwise unknown here.
///
/// # Errors
/// [`AllocationError::CudaOrderUnknown`] without `pci_bus_order` on a machine of several
/// models.
pub fn cuda_order(gpus: &[PciGpu], pci_bus_order: bool) -> Result<Vec<usize>, AllocationError> {
    let mut models: Vec<&str> = gpus.iter().map(|g| g.name.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    if !pci_bus_order && models.len() > 1 {
        return Err(AllocationError::CudaOrderUnknown {
            models: models.join(", "),
        });
    }
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    // Bus ids are fixed-width hex (domain:bus:device.function); case aside, text order is
    // bus order.
    order.sort_by_key(|&i| gpus[i].bus_id.to_ascii_lowercase());
    Ok(order)
}

/// The NVML positions `selectors` name, for the CUDA device numbers among them; other
/// selectors give `None`.
///
/// # Errors
/// As [`cuda_order`], and [`AllocationError::NoCudaDevice`] for a number past the GPUs.
pub fn resolve_cuda_indices(
    selectors: &[GpuSelector],
    gpus: &[PciGpu],
) -> Result<Vec<Option<usize>>, AllocationError> {
    let mut order = None;
    selectors
        .iter()
        .map(|s| match s {
            GpuSelector::CudaIndex {
                index,
                pci_bus_order,
            } => {
                let order = match &order {
                    Some(o) => o,
                    None => order.insert(cuda_order(gpus, *pci_bus_order)?),
                };
                (order.get(*index as usize).copied()).map(Some).ok_or(
                    AllocationError::NoCudaDevice {
                        index: *index,
                        count: gpus.len(),
                    },
                )
            }
            _ => Ok(None),
        })
        .collect()
}

/// What a `CUDA_VISIBLE_DEVICES` value holds.
enum Visible {
    Uuids(Vec<GpuSelector>),
    Numeric(Vec<u32>),
}

fn invalid(var: &str, value: &str, why: &str) -> AllocationError {
    AllocationError::Invalid {
        var: var.to_owned(),
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// The entries of a comma-separated list, trimmed; an error when it is empty or holds an
/// empty entry, or is Slurm's `NoDevFiles`.
fn entries<'a>(var: &str, value: &'a str) -> Result<Vec<&'a str>, AllocationError> {
    if value.trim().is_empty() {
        return Err(invalid(var, value, "names no GPU"));
    }
    if value.trim() == "NoDevFiles" {
        return Err(invalid(
            var,
            value,
            "Slurm's gres GPUs have no `File=` device on this node (gres.conf), so no device \
             index names them; ask the site to declare `File=/dev/nvidia[…]`, or pass the GPUs' \
             UUIDs with `--only-gpus`",
        ));
    }
    let list: Vec<&str> = value.split(',').map(str::trim).collect();
    if list.iter().any(|e| e.is_empty()) {
        return Err(invalid(var, value, "has an empty entry"));
    }
    Ok(list)
}

/// Drops repeated selectors, keeping the first of each.
fn dedup(list: Vec<GpuSelector>) -> Vec<GpuSelector> {
    let mut out: Vec<GpuSelector> = Vec::with_capacity(list.len());
    for s in list {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

fn parse_visible(var: &str, value: &str) -> Result<Visible, AllocationError> {
    let list = entries(var, value)?;
    if list.iter().any(|e| e.starts_with("MIG-")) {
        return Err(AllocationError::Mig {
            var: var.to_owned(),
            value: value.to_owned(),
        });
    }
    if list.iter().all(|e| is_uuid(e)) {
        return Ok(Visible::Uuids(dedup(
            list.into_iter()
                .map(|e| GpuSelector::Uuid(e.to_owned()))
                .collect(),
        )));
    }
    if let Ok(numbers) = list.iter().map(|e| e.parse::<u32>()).collect() {
        return Ok(Visible::Numeric(numbers));
    }
    Err(invalid(
        var,
        value,
        "is neither GPU UUIDs (GPU-…) nor device indices",
    ))
}

fn is_uuid(entry: &str) -> bool {
    entry.strip_prefix("GPU-").is_some_and(|rest| {
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

fn parse_indices(var: &str, value: &str) -> Result<Vec<GpuSelector>, AllocationError> {
    let list = entries(var, value)?;
    list.into_iter()
        .map(|e| {
            e.parse::<u32>().map(GpuSelector::Index).map_err(|_| {
                invalid(
                    var,
                    value,
                    &format!("{e:?} is not a device index (Slurm lists GPUs as 0,1,…)"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(dedup)
}

/// Parses a list of GPUs as `ladle scheduler --only-gpus` takes it: comma-separated device
/// indices (`/dev/nvidiaN`'s `N`) or UUIDs (`GPU-…`), mixed freely; repeats are dropped.
/// `option` names what the list came from in errors.
///
/// # Errors
/// [`AllocationError::Invalid`] for an empty list or entry, `NoDevFiles`, or an entry that is
/// neither; [`AllocationError::Mig`] for a MIG instance.
pub fn parse_gpu_list(option: &str, value: &str) -> Result<Vec<GpuSelector>, AllocationError> {
    let list = entries(option, value)?;
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        if e.starts_with("MIG-") {
            return Err(AllocationError::Mig {
                var: option.to_owned(),
                value: value.to_owned(),
            });
        } else if is_uuid(e) {
            out.push(GpuSelector::Uuid(e.to_owned()));
        } else if let Ok(i) = e.parse::<u32>() {
            out.push(GpuSelector::Index(i));
        } else {
            return Err(invalid(
                option,
                value,
                &format!("{e:?} is neither a device index nor a GPU UUID (GPU-…)"),
            ));
        }
    }
    Ok(dedup(out))
}

/// The GPUs this process was allocated, read through `get` (`|k| std::env::var(k).ok()` in
/// production, a map in tests), in the order of the module docs: `CUDA_VISIBLE_DEVICES`
/// UUIDs, else `SLURM_STEP_GPUS`, else `SLURM_JOB_GPUS`; `Ok(None)` outside Slurm when
/// nothing names GPUs (use every GPU).
///
/// # Errors
/// [`AllocationError`] for a variable that is set but names no GPU (empty, `NoDevFiles`,
/// unparsable, MIG), and [`AllocationError::NoSlurmGpus`] inside a Slurm job whose GPUs
/// nothing names unambiguously.
pub fn allocation_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<Vec<GpuSelector>>, AllocationError> {
    Ok(given_gpus(get)?.map(|(gpus, _)| gpus))
}

/// [`allocation_from_env`], with where the GPUs came from as `ladle queue` says it:
/// `CUDA_VISIBLE_DEVICES=2,3` or `SLURM_JOB_GPUS=1`.
///
/// # Errors
/// As [`allocation_from_env`].
pub fn given_gpus(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<(Vec<GpuSelector>, String)>, AllocationError> {
    const CVD: &str = "CUDA_VISIBLE_DEVICES";
    let from = |var: &str, value: &str| format!("{var}={value}");
    let visible = get(CVD);
    let numbers = match visible
        .as_deref()
        .map(|v| parse_visible(CVD, v))
        .transpose()?
    {
        Some(Visible::Uuids(uuids)) => {
            return Ok(Some((
                uuids,
                from(CVD, visible.as_deref().unwrap_or_default()),
            )));
        }
        Some(Visible::Numeric(numbers)) => Some(numbers),
        None => None,
    };
    for var in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(value) = get(var) {
            return parse_indices(var, &value).map(|gpus| Some((gpus, from(var, &value))));
        }
    }
    if let Some(job_id) = get("SLURM_JOB_ID") {
        return Err(AllocationError::NoSlurmGpus {
            job_id,
            cuda_visible_devices: visible.map_or_else(|| "unset".to_owned(), |v| format!("{v:?}")),
        });
    }
    let pci_bus_order = get("CUDA_DEVICE_ORDER").as_deref() == Some("PCI_BUS_ID");
    Ok(numbers.map(|numbers| {
        let gpus = dedup(
            numbers
                .into_iter()
                .map(|index| GpuSelector::CudaIndex {
                    index,
                    pci_bus_order,
                })
                .collect(),
        );
        let order = if pci_bus_order {
            "CUDA_DEVICE_ORDER=PCI_BUS_ID"
        } else {
            "CUDA's order"
        };
        let value = visible.as_deref().unwrap_or_default();
        (gpus, format!("{} ({order})", from(CVD, value)))
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<Vec<GpuSelector>>, AllocationError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        allocation_from_env(|k| map.get(k).cloned())
    }

    fn uuid(s: &str) -> GpuSelector {
        GpuSelector::Uuid(s.to_owned())
    }

    #[test]
    fn outside_slurm_with_nothing_set_every_gpu_is_used() {
        assert_eq!(from(&[]), Ok(None));
    }

    fn cuda(index: u32, pci_bus_order: bool) -> GpuSelector {
        GpuSelector::CudaIndex {
            index,
            pci_bus_order,
        }
    }

    #[test]
    fn outside_slurm_a_numeric_cuda_visible_devices_names_cuda_devices() {
        assert_eq!(
            from(&[("CUDA_VISIBLE_DEVICES", "2, 3,2")]),
            Ok(Some(vec![cuda(2, false), cuda(3, false)]))
        );
        assert_eq!(
            from(&[
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            ]),
            Ok(Some(vec![cuda(1, true)]))
        );
        // CUDA's own reading of an empty value: no GPU at all, never "every GPU".
        assert!(from(&[("CUDA_VISIBLE_DEVICES", "")]).is_err());
    }

    fn pci(list: &[(&str, &str)]) -> Vec<PciGpu> {
        (list.iter())
            .map(|(bus_id, name)| PciGpu {
                bus_id: (*bus_id).to_owned(),
                name: (*name).to_owned(),
            })
            .collect()
    }

    #[test]
    fn cuda_counts_one_models_gpus_in_pci_bus_order_whatever_nvml_lists_first() {
        let gpus = pci(&[
            ("00000000:DB:00.0", "NVIDIA H100 80GB HBM3"),
            ("00000000:1B:00.0", "NVIDIA H100 80GB HBM3"),
            ("00000000:3b:00.0", "NVIDIA H100 80GB HBM3"),
        ]);
        for pci_bus_order in [false, true] {
            assert_eq!(cuda_order(&gpus, pci_bus_order), Ok(vec![1, 2, 0]));
        }
        let selectors = [cuda(2, false), GpuSelector::Index(5), cuda(0, false)];
        assert_eq!(
            resolve_cuda_indices(&selectors, &gpus),
            Ok(vec![Some(0), None, Some(1)])
        );
        let err = resolve_cuda_indices(&[cuda(3, false)], &gpus).unwrap_err();
        assert_eq!(err, AllocationError::NoCudaDevice { index: 3, count: 3 });
        assert!(err.to_string().contains("3 GPUs"), "{err}");
    }

    #[test]
    fn a_jobs_gpus_are_found_on_the_machine_by_device_file_uuid_or_cuda_number() {
        let bus = pci(&[
            ("00000000:DB:00.0", "NVIDIA H100 80GB HBM3"),
            ("00000000:1B:00.0", "NVIDIA H100 80GB HBM3"),
        ]);
        let machine: Vec<MachineGpu> = (bus.into_iter().enumerate())
            .map(|(i, pci)| MachineGpu {
                minor: Some(i as u32 + 4),
                uuid: format!("GPU-{i}"),
                pci,
            })
            .collect();
        // NVML lists DB first; CUDA counts 1B (GPU-1) first.
        let selectors = [
            cuda(0, false),
            GpuSelector::Index(4),
            uuid("GPU-1"),
            cuda(1, true),
        ];
        assert_eq!(
            machine_uuids(&selectors, &machine),
            Ok(vec!["GPU-1", "GPU-0", "GPU-1", "GPU-0"]
                .into_iter()
                .map(str::to_owned)
                .collect())
        );
        for missing in [GpuSelector::Index(0), uuid("GPU-9")] {
            let err = machine_uuids(std::slice::from_ref(&missing), &machine).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&missing.to_string()) && text.contains("/dev/nvidia5 GPU-1"),
                "{text}"
            );
        }
        assert_eq!(
            machine_uuids(&[cuda(2, false)], &machine),
            Err(AllocationError::NoCudaDevice { index: 2, count: 2 })
        );
    }

    #[test]
    fn on_mixed_models_cuda_order_is_known_only_in_pci_bus_order() {
        let gpus = pci(&[
            ("00000000:65:00.0", "NVIDIA A100-SXM4-80GB"),
            ("00000000:17:00.0", "NVIDIA L4"),
        ]);
        let err = cuda_order(&gpus, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID")
                && text.contains("NVIDIA L4")
                && text.contains("A100"),
            "{text}"
        );
        assert_eq!(cuda_order(&gpus, true), Ok(vec![1, 0]));
        assert_eq!(
            resolve_cuda_indices(&[cuda(0, true)], &gpus),
            Ok(vec![Some(1)])
        );
    }

    #[test]
    fn uuids_in_cuda_visible_devices_win_over_slurm_indices() {
        let got = from(&[
            ("CUDA_VISIBLE_DEVICES", "GPU-aa11-bb22, GPU-cc33"),
            ("SLURM_JOB_GPUS", "0,1"),
            ("SLURM_JOB_ID", "42"),
        ]);
        assert_eq!(got, Ok(Some(vec![uuid("GPU-aa11-bb22"), uuid("GPU-cc33")])));
    }

    #[test]
    fn uuids_in_cuda_visible_devices_are_used_outside_slurm_too() {
        let got = from(&[("CUDA_VISIBLE_DEVICES", "GPU-0f")]);
        assert_eq!(got, Ok(Some(vec![uuid("GPU-0f")])));
    }

    #[test]
    fn mig_instances_in_cuda_visible_devices_are_an_error_naming_the_variable() {
        let got = from(&[
            ("CUDA_VISIBLE_DEVICES", "MIG-4b3f-11"),
            ("SLURM_JOB_GPUS", "0"),
        ]);
        let err = got.unwrap_err();
        assert!(matches!(err, AllocationError::Mig { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("CUDA_VISIBLE_DEVICES") && text.contains("MIG-4b3f-11"),
            "{text}"
        );
    }

    #[test]
    fn the_step_gpus_come_before_the_job_gpus() {
        let got = from(&[
            ("SLURM_STEP_GPUS", "2"),
            ("SLURM_JOB_GPUS", "2,3"),
            ("SLURM_JOB_ID", "42"),
        ]);
        assert_eq!(got, Ok(Some(vec![GpuSelector::Index(2)])));
    }

    #[test]
    fn the_job_gpus_are_node_indices_kept_as_slurm_wrote_them() {
        // A numeric CUDA_VISIBLE_DEVICES renumbered from 0 by ConstrainDevices is not used.
        let got = from(&[
            ("SLURM_JOB_GPUS", "2,3"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("SLURM_JOB_ID", "42"),
        ]);
        assert_eq!(
            got,
            Ok(Some(vec![GpuSelector::Index(2), GpuSelector::Index(3)]))
        );
    }

    #[test]
    fn a_slurm_job_with_only_a_numeric_cuda_visible_devices_is_told_how_to_ask_for_gpus() {
        let err = from(&[("SLURM_JOB_ID", "42"), ("CUDA_VISIBLE_DEVICES", "0,1")]).unwrap_err();
        assert!(
            matches!(err, AllocationError::NoSlurmGpus { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("42") && text.contains("\"0,1\"") && text.contains("--gres=gpu:N"),
            "{text}"
        );
    }

    #[test]
    fn a_slurm_job_without_any_gpu_variable_is_an_error() {
        let err = from(&[("SLURM_JOB_ID", "7")]).unwrap_err();
        assert!(err.to_string().contains("it is unset"), "{err}");
    }

    #[test]
    fn empty_values_are_errors_naming_the_variable() {
        for var in ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
            let err = from(&[(var, "")]).unwrap_err();
            assert!(
                matches!(&err, AllocationError::Invalid { var: v, .. } if v == var),
                "{err:?}"
            );
        }
        let err = from(&[("SLURM_JOB_GPUS", "0,,1")]).unwrap_err();
        assert!(err.to_string().contains("empty entry"), "{err}");
    }

    #[test]
    fn no_dev_files_is_an_error_that_says_what_slurm_lacks() {
        for var in ["CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"] {
            let err = from(&[(var, "NoDevFiles"), ("SLURM_JOB_ID", "1")]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(var) && text.contains("File="), "{text}");
        }
    }

    #[test]
    fn garbage_is_an_error_naming_the_variable_and_its_value() {
        let err = from(&[("SLURM_JOB_GPUS", "0,gpu1")]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("SLURM_JOB_GPUS") && text.contains("gpu1"),
            "{text}"
        );
        let err = from(&[("CUDA_VISIBLE_DEVICES", "0,GPU-aa")]).unwrap_err();
        assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES"), "{err}");
        let err = from(&[("CUDA_VISIBLE_DEVICES", "GPU-")]).unwrap_err();
        assert!(matches!(err, AllocationError::Invalid { .. }), "{err:?}");
    }

    #[test]
    fn repeated_gpus_count_once() {
        let got = from(&[("SLURM_JOB_GPUS", "1,1,0")]);
        assert_eq!(
            got,
            Ok(Some(vec![GpuSelector::Index(1), GpuSelector::Index(0)]))
        );
    }

    #[test]
    fn a_gpu_list_mixes_indices_and_uuids() {
        assert_eq!(
            parse_gpu_list("--only-gpus", "0, GPU-ab,3"),
            Ok(vec![
                GpuSelector::Index(0),
                uuid("GPU-ab"),
                GpuSelector::Index(3)
            ])
        );
        for bad in ["", "0,x", "MIG-1", "-1"] {
            let err = parse_gpu_list("--only-gpus", bad).unwrap_err();
            assert!(err.to_string().starts_with("--only-gpus="), "{err}");
        }
    }

    #[test]
    fn a_selector_displays_as_its_device_file_or_uuid() {
        assert_eq!(GpuSelector::Index(3).to_string(), "/dev/nvidia3");
        assert_eq!(uuid("GPU-ab").to_string(), "GPU-ab");
    }
}
