#!/usr/bin/env python3
"""Writes the model files of perfmodel/data/ from the networks' definitions.

Each network is built here layer by layer as its reference implementation
defines it (torchvision's ResNet-50/101 and VGG-16, Hugging Face's
bert-base-uncased and gpt2), so every gradient tensor has its real shape,
and the script checks the total against the published parameter count.
Forward FLOPs per sample are 2 x multiply-accumulates of each layer's
matrix products and convolutions (attention's products included),
attributed to the layer's weight tensor. Parameters are listed in backward
order: the output layer first, as DDP sees them become ready.

Usage: scripts/gen-models.py [OUT_DIR]   (default perfmodel/data)
"""
import os
import sys

# Measured training throughput from Gavel (Narayanan et al., OSDI 2020),
# ../shared/data/gavel-throughputs.csv: ResNet-50 on ImageNet, one worker,
# iterations/s at each batch size, converted to samples/s here.
GAVEL_RESNET50 = {
    "k80": {16: 2.3005, 32: 1.2366, 64: 0.6190, 128: 0.3472},
    "p100": {16: 9.0530, 32: 4.8883, 64: 2.6195, 128: 1.5844},
    "v100": {16: 11.3961, 32: 7.7873, 64: 4.3948, 128: 2.4968},
}


class Net:
    def __init__(self):
        self.layers = []  # forward order: (name, params, flops)
        self.act = 0.0  # activation bytes per sample (fp32), estimated

    def add(self, name, params, flops=0.0):
        self.layers.append((name, params, flops))

    def params(self):
        return sum(p for _, p, _ in self.layers)


def conv(net, name, cin, cout, k, hout, bias=False, bn=True):
    net.add(name + ".weight", cin * cout * k * k, 2.0 * cin * cout * k * k * hout * hout)
    if bias:
        net.add(name + ".bias", cout, 0.0)
    # Kept for the backward pass: the convolution's output and, with batch
    # norm, the normalised one (ReLU runs in place).
    net.act += 4.0 * cout * hout * hout * (2 if bn else 1)
    if bn:
        net.add(name.replace("conv", "bn") + ".weight", cout, 0.0)
        net.add(name.replace("conv", "bn") + ".bias", cout, 0.0)


def resnet(blocks):
    net = Net()
    conv(net, "conv1", 3, 64, 7, 112)
    cin, size = 64, 56
    for stage, (n, width) in enumerate(zip(blocks, [64, 128, 256, 512])):
        for b in range(n):
            stride = 2 if (b == 0 and stage > 0) else 1
            out_size = size // stride
            p = f"layer{stage + 1}.{b}."
            conv(net, p + "conv1", cin, width, 1, size)
            conv(net, p + "conv2", width, width, 3, out_size)
            conv(net, p + "conv3", width, width * 4, 1, out_size)
            if b == 0:
                net.add(p + "downsample.0.weight", cin * width * 4, 2.0 * cin * width * 4 * out_size * out_size)
                net.add(p + "downsample.1.weight", width * 4, 0.0)
                net.add(p + "downsample.1.bias", width * 4, 0.0)
                net.act += 4.0 * width * 4 * out_size * out_size * 2
            cin, size = width * 4, out_size
    net.add("fc.weight", 2048 * 1000, 2.0 * 2048 * 1000)
    net.add("fc.bias", 1000, 0.0)
    return net


def vgg16():
    net = Net()
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    cin, size, i = 3, 224, 0
    for v in cfg:
        if v == "M":
            size //= 2
            i += 1
            continue
        conv(net, f"features.{i}", cin, v, 3, size, bias=True, bn=False)
        cin = v
        i += 2
    for j, (a, b) in enumerate([(25088, 4096), (4096, 4096), (4096, 1000)]):
        net.add(f"classifier.{3 * j}.weight", a * b, 2.0 * a * b)
        net.add(f"classifier.{3 * j}.bias", b, 0.0)
        net.act += 4.0 * b * 2
    return net


def linear(net, name, a, b, tokens):
    net.add(name + ".weight", a * b, 2.0 * a * b * tokens)
    net.add(name + ".bias", b, 0.0)


def layernorm(net, name, d):
    net.add(name + ".weight", d, 0.0)
    net.add(name + ".bias", d, 0.0)


def transformer_act(layers, s, h, a):
    # Korthikanti et al. 2022 (Reducing activation recomputation in large
    # transformer models): s*h*(34 + 5*a*s/h) bytes per layer per sample
    # with 16-bit activations; doubled for fp32.
    return 2.0 * layers * s * h * (34 + 5 * a * s / h)


def bert_base(seq=128):
    net, d, ff = Net(), 768, 3072
    net.add("embeddings.word_embeddings.weight", 30522 * d, 0.0)
    net.add("embeddings.position_embeddings.weight", 512 * d, 0.0)
    net.add("embeddings.token_type_embeddings.weight", 2 * d, 0.0)
    layernorm(net, "embeddings.LayerNorm", d)
    for i in range(12):
        p = f"encoder.layer.{i}."
        linear(net, p + "attention.self.query", d, d, seq)
        linear(net, p + "attention.self.key", d, d, seq)
        linear(net, p + "attention.self.value", d, d, seq)
        # Scores (QK^T) and the weighted sum of values: 2 x 2*s*s*d.
        net.layers[-2] = (net.layers[-2][0], net.layers[-2][1], net.layers[-2][2] + 4.0 * seq * seq * d)
        linear(net, p + "attention.output.dense", d, d, seq)
        layernorm(net, p + "attention.output.LayerNorm", d)
        linear(net, p + "intermediate.dense", d, ff, seq)
        linear(net, p + "output.dense", ff, d, seq)
        layernorm(net, p + "output.LayerNorm", d)
    linear(net, "pooler.dense", d, d, 1)
    net.act = transformer_act(12, seq, d, 12)
    return net


def gpt2_small(seq=1024):
    net, d, ff, vocab = Net(), 768, 3072, 50257
    # The output projection is tied to the token embedding: its FLOPs go
    # to that tensor, whose gradient is complete only at the very end.
    net.add("wte.weight", vocab * d, 2.0 * vocab * d * seq)
    net.add("wpe.weight", 1024 * d, 0.0)
    for i in range(12):
        p = f"h.{i}."
        layernorm(net, p + "ln_1", d)
        linear(net, p + "attn.c_attn", d, 3 * d, seq)
        net.layers[-2] = (net.layers[-2][0], net.layers[-2][1], net.layers[-2][2] + 4.0 * seq * seq * d)
        linear(net, p + "attn.c_proj", d, d, seq)
        layernorm(net, p + "ln_2", d)
        linear(net, p + "mlp.c_fc", d, ff, seq)
        linear(net, p + "mlp.c_proj", ff, d, seq)
    layernorm(net, "ln_f", d)
    net.act = transformer_act(12, seq, d, 12)
    return net


MODELS = [
    # name, builder, published parameter count, header, sample/train lines
    ("resnet50", lambda: resnet([3, 4, 6, 3]), 25_557_032,
     "ResNet-50 (He et al. 2016), torchvision resnet50: 25,557,032 parameters.\n"
     "ImageNet-1k: 1,281,167 training images; ~110 kB per JPEG read, a 3x224x224 fp32 tensor copied.\n"
     "SGD with momentum: 4 bytes of state per parameter. Measured speeds: Gavel (OSDI 2020).",
     "sample read_bytes=110000 input_bytes=602112", "train batch_per_device=32 dataset_samples=1281167 state_bytes_per_param=4", GAVEL_RESNET50),
    ("resnet101", lambda: resnet([3, 4, 23, 3]), 44_549_160,
     "ResNet-101 (He et al. 2016), torchvision resnet101: 44,549,160 parameters. ImageNet-1k as resnet50.",
     "sample read_bytes=110000 input_bytes=602112", "train batch_per_device=32 dataset_samples=1281167 state_bytes_per_param=4", None),
    ("vgg16", vgg16, 138_357_544,
     "VGG-16 (Simonyan and Zisserman 2015), torchvision vgg16: 138,357,544 parameters. ImageNet-1k.",
     "sample read_bytes=110000 input_bytes=602112", "train batch_per_device=32 dataset_samples=1281167 state_bytes_per_param=4", None),
    ("bert-base", bert_base, 109_482_240,
     "BERT-base (Devlin et al. 2019), bert-base-uncased with pooler: 109,482,240 parameters.\n"
     "Sequence length 128 (pre-training phase 1); ids, mask and segment as int64.\n"
     "Dataset: BookCorpus + English Wikipedia, ~3.3 billion words, as ~25.8 million 128-token sequences.\n"
     "Adam: 8 bytes of state per parameter.",
     "sample read_bytes=1024 input_bytes=3072", "train batch_per_device=32 dataset_samples=25800000 state_bytes_per_param=8", None),
    ("gpt2-small", gpt2_small, 124_439_808,
     "GPT-2 small (Radford et al. 2019), Hugging Face gpt2 with tied embeddings: 124,439,808 parameters.\n"
     "Context 1024 tokens; OpenWebText, ~9 billion tokens as ~8.8 million sequences. Adam.",
     "sample read_bytes=2048 input_bytes=8192", "train batch_per_device=8 dataset_samples=8800000 state_bytes_per_param=8", None),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "perfmodel", "data")
    for name, build, published, header, sample, train, measured in MODELS:
        net = build()
        if net.params() != published:
            sys.exit(f"{name}: built {net.params()} parameters, published {published}")
        lines = ["# " + h for h in header.split("\n")]
        lines.append(f"# Generated by scripts/gen-models.py; forward GFLOPs per sample: {sum(f for _, _, f in net.layers) / 1e9:.2f}.")
        lines.append(f"# Activation bytes per sample are an estimate (see the script).")
        lines.append(f"model name={name} params={published}")
        lines.append(f"{sample} activation_bytes={int(net.act)}")
        lines.append(train)
        for dev, table in sorted((measured or {}).items()):
            for batch, its in sorted(table.items()):
                lines.append(f"measured device={dev} batch={batch} samples_per_s={its * batch:.4f}")
        for lname, params, flops in reversed(net.layers):
            lines.append(f"layer name={lname} params={params} flops={flops:.6g}")
        with open(os.path.join(out, name + ".model"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {published} parameters, {len(net.layers)} tensors")


if __name__ == "__main__":
    main()
