"""Build ``_gpuportal_libslurm``: the few libslurm calls of a batch submission, for the Slurm whose
headers are on this machine (Debian's ``libslurm-dev``: 22.05), with cffi in API mode.

``python -m portal.slurm.libslurm_build [--include DIR] [--lib DIR] [--out DIR]`` compiles it (~4 s)
into the venv's site-packages (``make native``; ``scripts/cluster up`` installs the headers). The
module carries the ``SLURM_VERSION_NUMBER`` it was built against: the cli gateway submits through it
only for a cluster of the same release (``portal.slurm.native``). Only ``portal.slurm.native_helper``
imports it, in a process of its own.

The job descriptor is declared with ``...;``: cffi takes every offset and size from the real header
at compile time, so only the fields named here exist for Python, each with its real type.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

MODULE = "_gpuportal_libslurm"

# The job_desc_msg_t fields a submission sets (portal.slurm.native_request.FIELDS says which Python
# type each gets); cffi checks each declaration against slurm.h.
CDEF = """
typedef struct job_descriptor {
    char *account;
    uint32_t argc;
    char **argv;
    char *array_inx;
    uint64_t bitflags;
    char *comment;
    uint16_t contiguous;
    uint16_t cpus_per_task;
    char *cpus_per_tres;
    char *dependency;
    char **environment;
    uint32_t env_size;
    char *exc_nodes;
    char *features;
    uint32_t group_id;
    uint16_t mail_type;
    uint32_t max_nodes;
    uint32_t min_cpus;
    uint32_t min_nodes;
    char *name;
    uint32_t nice;
    uint32_t num_tasks;
    uint16_t ntasks_per_node;
    uint8_t open_mode;
    char *partition;
    uint16_t pn_min_cpus;
    uint64_t pn_min_memory;
    uint32_t priority;
    char *qos;
    uint16_t requeue;
    char *reservation;
    char *script;
    uint16_t shared;
    char *std_err;
    char *std_in;
    char *std_out;
    char *submit_line;
    uint32_t task_dist;
    uint32_t time_limit;
    uint32_t time_min;
    char *tres_per_job;
    char *tres_per_node;
    uint32_t user_id;
    uint16_t warn_flags;
    uint16_t warn_signal;
    uint16_t warn_time;
    char *work_dir;
    ...;
} job_desc_msg_t;

typedef struct submit_response_msg {
    uint32_t job_id;
    uint32_t step_id;
    uint32_t error_code;
    char *job_submit_user_msg;
    ...;
} submit_response_msg_t;

void slurm_init(const char *conf);
void slurm_init_job_desc_msg(job_desc_msg_t *job_desc_msg);
int slurm_submit_batch_job(job_desc_msg_t *job_desc_msg, submit_response_msg_t **slurm_alloc_msg);
void slurm_free_submit_response_response_msg(submit_response_msg_t *msg);
int slurm_get_errno(void);
char *slurm_strerror(int errnum);

#define SLURM_VERSION_NUMBER ...
"""

SOURCE = """
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
"""


def build(include_dir: str = "", lib_dir: str = "", out_dir: str = "") -> Path:
    import cffi  # a build-time need only (the portal imports the built module, never cffi)

    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.set_source(
        MODULE, SOURCE, libraries=["slurm"],
        include_dirs=[include_dir] if include_dir else [],
        library_dirs=[lib_dir] if lib_dir else [],
        runtime_library_dirs=[lib_dir] if lib_dir else [],
    )  # fmt: skip
    target = Path(out_dir or sysconfig.get_paths()["platlib"])
    work = Path(target, f".{MODULE}-build")
    built = ffi.compile(tmpdir=str(work), verbose=False)
    destination = target / Path(built).name
    Path(built).replace(destination)
    return destination


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", default="", help="where slurm/slurm.h is (default: the compiler's path)")
    parser.add_argument("--lib", default="", help="where libslurm.so is (default: the linker's path)")
    parser.add_argument("--out", default="", help="where the module goes (default: this Python's site-packages)")
    args = parser.parse_args()
    print(build(args.include, args.lib, args.out))


if __name__ == "__main__":
    main()
