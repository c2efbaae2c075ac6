#!/bin/sh
# initContainer 运行的数据准备脚本：把「数据集」解压到 $DATA_DIR（默认 /data）。
set -e
DATA_DIR="${DATA_DIR:-/data}"
mkdir -p "$DATA_DIR"
for i in 1 2 3; do
  echo "shard $i: tokens $((i * 1000))..$((i * 1000 + 999))" > "$DATA_DIR/shard-$i.txt"
done
echo "dataset ready: $(ls "$DATA_DIR" | wc -l) shards in $DATA_DIR"
