#!/bin/sh
# testbed run: make the run folder and unpack the tar.gz read from stdin into it (testbed.run.ranks.upload).
# usage: unpack.sh RUN_DIR     ("~" and "~/" at the start of RUN_DIR are $HOME)
dir=$1
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
mkdir -p -- "$dir" && cd -- "$dir" && tar xzf -
