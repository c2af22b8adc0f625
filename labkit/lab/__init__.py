"""The lab's records: what every run leaves on disk and how it is checked.

    runs      run folders, manifests, atomic writes, digests, the FINISHED marker
    state     full resumable training states: capture, save, load, compare exactly
    skeleton  one run's life: hold the folder, refuse or clear an earlier attempt, autosave, Ctrl-C
    resume    the exact-resume check: a continuous run against a stopped-then-resumed one
    runtime   seeds, deterministic kernels, versions, the code's and data's digests
    memory    the process's peak memory, measured one way
    workers   jobs in worker processes that fail alone and never outlive their command
    errors    a user's mistake as one line and exit 2, for every command
    fingerprint  what a piece of code does: the definitions an entry point reaches, without prose or layout
    cache     what made each cached step of the tiny run (code fingerprints, file digests), and whether it is stale

May import: nothing of labkit.
"""
