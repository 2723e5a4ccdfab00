"""tracekit where training already happens: callbacks for PyTorch Lightning (:mod:`.lightning`) and Hugging Face
``transformers.Trainer`` (:mod:`.huggingface`) that profile a few steps on every rank and print the verdict, and the
experiment trackers the answer is logged to (:mod:`.trackers`). Each framework is imported only by its own module."""
