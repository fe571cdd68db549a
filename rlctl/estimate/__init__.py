"""What a recipe will cost before it runs: the LR per optimizer step and the GPU memory."""
