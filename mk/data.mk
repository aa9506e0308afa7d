# The input pipeline's benchmark (issue 18); its tests run with the trainer's (trainer it
# image_data:: and data_pipeline::).
.PHONY: bench-data

## bench-data: decoded+augmented images/s of the image pipeline vs PyTorch's DataLoader + torchvision, 1 and 2 threads; writes out/bench/data.json.
bench-data: data
	bench/data.sh
