"""Lightning recipes: the same transformer trained with any registered encoding on real data.

Installed as `mmpe.recipes` (the repository keeps them in `recipes/`; configs ship as
`mmpe.configs`). One module per modality; each defines `COMPARE` and `run_one` for
`mmpe compare` (see [`mmpe.recipes.compare`][recipes.compare]) and a LightningCLI entry point
(`python -m mmpe.recipes.<modality>`). They need the `mmpe[recipes]` extra (Lightning,
jsonargparse, matplotlib) and, for their data, `mmpe[data]`.
"""

#: Every recipe ``mmpe compare`` knows, by name: its module and one line on what it trains.
#: A static table, so that listing recipes imports none of them (nor Lightning).
RECIPES: dict[str, tuple[str, str]] = {
    "text": ("mmpe.recipes.text", "character LM on Shakespeare; bpc at 1x-8x the training length"),
    "vision": ("mmpe.recipes.vision", "MNIST ViT; accuracy at larger resolutions"),
    "video": ("mmpe.recipes.video", "moving-MNIST clips; accuracy at longer clips"),
    "audio": ("mmpe.recipes.audio", "espeak-ng spoken digits on spectrograms; held-out speakers"),
    "graph": ("mmpe.recipes.graph", "molecular property regression (solubility, FreeSolv)"),
    "molecules3d": ("mmpe.recipes.molecules3d", "graph molecules + RDKit conformers: SPD, 3D distance, both"),
    "tabular": ("mmpe.recipes.tabular", "ISLP/scikit-learn tables; feature-graph encodings"),
    "sphere": ("mmpe.recipes.sphere", "land/sea and geoid height on the sphere"),
    "sst": ("mmpe.recipes.sst", "SST: next-month anomaly (OSTIA) and global infilling (HadISST)"),
    "context": ("mmpe.recipes.context", "RoPE scalings extend a char LM trained at 64 characters: "
                "zero-shot and fine-tuned bpc to 16x"),
    "lengthgen": ("mmpe.recipes.lengthgen", "train short, test long: copy, reverse, sort, addition, "
                  "parity, SCAN, passkey; exact match per length bucket"),
    "genomics": ("mmpe.recipes.genomics", "lambda DNA + JASPAR motifs: periodic, local, bits/nt"),
    "multimodal": ("mmpe.recipes.multimodal", "read a strip of MNIST digits as text"),
}

#: Stored results that are measurements, not trainings: their `CompareSpec` (how `mmpe report`
#: renders them) lives in a script of the repository checkout, run directly (`benchmarks/` is
#: not installed). `mmpe compare` does not run them; `mmpe report` renders their stores.
MEASUREMENTS: dict[str, tuple[str, str]] = {
    "gpu_cost": ("benchmarks/gpu/gpu_cost.py", "attention fwd+bwd time and memory on a CUDA "
                 "device, × the unbiased layer (python benchmarks/gpu/gpu_cost.py)"),
}
