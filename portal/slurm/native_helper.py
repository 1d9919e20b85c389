"""The native submitter's helper process: ``python -m portal.slurm.native_helper``.

It loads libslurm (``_gpuportal_libslurm``, see libslurm_build) once, then answers batches of job
descriptors read from stdin, each with ``slurm_submit_batch_job``: what sbatch itself calls once
its options are read, without a process, a dynamic link and a read of slurm.conf per job.

Its own process because libslurm holds one configuration per process (the cluster's SLURM_CONF, in
this process's environment), because two Slurm libraries in one process share sonames (pyslurm's
libslurmfull of 25.11 would answer this one's plugins), and so that a crash in libslurm costs a
helper, not a Celery worker: the parent (portal.slurm.native) starts another.

Frames both ways: a 4-byte big-endian length, then a pickle. A request is a list of jobs, each a
dict ``{"fields": {name: int | str}, "environment": [str], "argv": [str]}``; the answer is a list
of the same length of ``("ok", job_id, user_message)`` or ``("error", errno, strerror)``. Only the
portal's own parent process writes to it (its stdin is a pipe the parent holds). Imports nothing of
Django or the portal.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

_HEADER = struct.Struct(">I")


def _read_exact(stream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def submit_one(ffi, lib, job: dict) -> tuple:
    desc = ffi.new("job_desc_msg_t *")
    lib.slurm_init_job_desc_msg(desc)
    keep = []  # every C string of this descriptor lives until the call returns

    def c_string(text: str):
        buffer = ffi.new("char[]", text.encode())
        keep.append(buffer)
        return buffer

    def c_array(items: list[str]):
        array = ffi.new("char *[]", [c_string(item) for item in items] + [ffi.NULL])
        keep.append(array)
        return array

    for name, value in job["fields"].items():
        setattr(desc, name, c_string(value) if isinstance(value, str) else value)
    environment = job.get("environment") or []
    desc.environment, desc.env_size = c_array(environment), len(environment)
    argv = job.get("argv") or []
    if argv:
        desc.argv, desc.argc = c_array(argv), len(argv)
    response = ffi.new("submit_response_msg_t **")
    if lib.slurm_submit_batch_job(desc, response) != 0 or response[0] == ffi.NULL:
        errno = lib.slurm_get_errno()
        return ("error", errno, ffi.string(lib.slurm_strerror(errno)).decode(errors="replace"))
    job_id = response[0].job_id
    message = response[0].job_submit_user_msg
    user_message = ffi.string(message).decode(errors="replace") if message != ffi.NULL else ""
    lib.slurm_free_submit_response_response_msg(response[0])
    return ("ok", int(job_id), user_message)


def main() -> int:
    # Slurm's plugins (select/cons_tres, auth/munge, ...) link against nothing: they find libslurm's
    # symbols in the process's global scope, as they find them in sbatch (linked to libslurmfull).
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
    from _gpuportal_libslurm import ffi, lib

    lib.slurm_init(ffi.NULL)  # SLURM_CONF from this process's environment
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact(stdin, _HEADER.size))
            jobs = pickle.loads(_read_exact(stdin, size))
        except EOFError:
            return 0
        answer = pickle.dumps([submit_one(ffi, lib, job) for job in jobs], protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(_HEADER.pack(len(answer)) + answer)
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
