"""Lightning recipes: the same transformer trained with any registered encoding on real data.

One module per modality; each defines ``COMPARE`` and ``run_one`` for ``mmpe compare``
(see :mod:`mmpe.compare`) and a LightningCLI entry point (``python -m recipes.<modality>``).
"""
