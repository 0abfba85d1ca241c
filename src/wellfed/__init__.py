"""wellfed: reproducible, GPU-saturating fine-tuning of Hugging Face text classifiers."""

__version__ = "0.1.0"
