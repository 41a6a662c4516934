"""A training job for the multi-worker tests (run by tf_glp.launch, or alone).

    python multi_worker_job.py OUT_DIR [--update host|replicas] [--replicas N] [--kill-at STEP] [--backup DIR]

Trains a small model with Dropout and BatchNormalization for 2 epochs of 10
steps (global batch 32, unshuffled, so every run sees the same data order)
under tf_glp.Strategy(update=--update, default "replicas"), then writes OUT_DIR/w{task}.npz:
trainable weights, optimizer variables, evaluate() and predict() results.
--kill-at makes worker 1 SIGKILL itself after that global step; --term-at
sends it SIGTERM (a preemption) after that step;
--backup adds keras.callbacks.BackupAndRestore(DIR, save_freq=3);
--worker1-width / --worker1-batch start a bad job (worker 1 differs);
--stock runs TensorFlow's MultiWorkerMirroredStrategy (one CPU per worker);
--profile adds tf_glp's ConcurrencyProfiler (plan OUT_DIR/plan{task}.json)
whose choice is forced to differ between workers (chief 1 lane, worker 1 two);
--chunking runs chunking="auto"'s GPU path with scripted step times under
which the workers would decide differently (the chief 2 chunks, worker 1 one),
each worker with a plan store of its own (OUT_DIR/cache{task});
--engine slurm takes the cluster from SLURM's variables (tf_glp.slurm_cluster)
instead of TF_CONFIG (which may also be TFJob's chief + worker form);
--ray-checkpoint N saves through tf_glp.callbacks.RayCheckpoint(save_freq=N)
(run under Ray Train: ray_train_loop), --preempt-at N gives worker 1 Ray's
preemption notice from step N;
--micro-batches M trains with tf_glp.Strategy(micro_batches=M) (Grappler's
arithmetic optimizer off, for bitwise comparisons) and saves the metrics' and
the seed generators' states and the history too.
"""

import argparse
import os
import signal

import numpy as np

import tf_glp

def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--replicas", type=int, default=None)
    parser.add_argument("--update", default="replicas", choices=["host", "replicas"])
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--backup", default=None)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--stock", action="store_true", help="tf.distribute.MultiWorkerMirroredStrategy instead")
    parser.add_argument("--worker1-width", type=int, default=None, help="another model on worker 1 (a bad job)")
    parser.add_argument("--worker1-batch", type=int, default=None, help="another batch size on worker 1 (a bad job)")
    parser.add_argument("--profile", action="store_true", help="with ConcurrencyProfiler, workers measuring otherwise")
    parser.add_argument("--chunking", action="store_true", help="chunking='auto' measured, workers timing otherwise")
    parser.add_argument("--no-input", action="store_true", help="a Sequential without keras.Input (unbuilt at fit)")
    parser.add_argument("--micro-batches", type=int, default=None)
    parser.add_argument("--engine", default=None, choices=["slurm"], help="the cluster from SLURM's variables")
    parser.add_argument("--ray-checkpoint", type=int, default=0, help="tf_glp.callbacks.RayCheckpoint(save_freq=N)")
    parser.add_argument("--preempt-at", type=int, default=0, help="Ray's preemption notice on worker 1 from step N")
    parser.add_argument("--term-at", type=int, default=0, help="worker 1 sends itself SIGTERM after step N (once)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    resolver = (tf_glp.slurm_cluster() if args.engine == "slurm"
                else tf.distribute.cluster_resolver.TFConfigClusterResolver())
    # This worker's id in the cluster (a TFJob's chief is 0, its workers 1...), which names its files.
    task = 0 if resolver.task_type in (None, "chief") else resolver.task_id + ("chief" in resolver.cluster_spec().jobs)
    if args.stock:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf_glp.Strategy(update=args.update, cpu_replicas=args.replicas, micro_batches=args.micro_batches,
                                   cluster_resolver=resolver if args.engine else None)

    import keras  # (after the Strategy: it configures TensorFlow's devices)

    if not args.stock:
        print("strategy:", strategy.explain().splitlines()[0], flush=True)

    if args.micro_batches:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})

    width = args.worker1_width if task == 1 and args.worker1_width else args.width
    batch = args.worker1_batch if task == 1 and args.worker1_batch else 32
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 8)).astype("float32")
    y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([
            *([] if args.no_input else [keras.Input((8,))]),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(2),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


    class KillAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marker = os.path.join(args.out, "killed")  # once: Ray runs this function again after the kill
            step = int(self.model.optimizer.iterations.numpy())
            if task == 1 and step == args.kill_at and not os.path.exists(marker):
                open(marker, "w").close()
                print(f"killing worker {task} after step {args.kill_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    class TermAt(keras.callbacks.Callback):
        """A preemption signal, as Kubernetes or SLURM sends it, to worker 1."""

        def on_train_batch_end(self, batch, logs=None):
            marker = os.path.join(args.out, "signalled")  # once: the restarted job runs this again
            if task == 1 and int(self.model.optimizer.iterations.numpy()) >= args.term_at and not os.path.exists(marker):
                open(marker, "w").close()
                print(f"SIGTERM to worker {task} after step {int(self.model.optimizer.iterations.numpy())}", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

    class FirstStep(keras.callbacks.Callback):
        """Appends the global step this process's fit starts at to
        OUT_DIR/first_steps{task}.txt (a resumed fit starts past 0)."""

        def on_train_batch_begin(self, batch, logs=None):
            if not getattr(self, "written", False):
                with open(os.path.join(args.out, f"first_steps{task}.txt"), "a") as f:
                    f.write(f"{int(self.model.optimizer.iterations.numpy())}\n")
                self.written = True

    callbacks = [FirstStep()]
    if args.backup:
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup, save_freq=3))
    if args.ray_checkpoint:
        callbacks.append(tf_glp.callbacks.RayCheckpoint(save_freq=args.ray_checkpoint))
    if args.preempt_at:
        import ray.train

        # What Ray's preemption watcher would set on a worker of a draining node.
        ray.train.get_preemption_info = lambda: (
            "draining" if task == 1 and int(model.optimizer.iterations.numpy()) >= args.preempt_at else None)
    if args.kill_at:
        callbacks.append(KillAt())
    if args.term_at:
        callbacks.insert(0, TermAt())
    if args.chunking:
        from tf_glp.strategy import chunking_decision, cost_model

        # The GPU path on CPU replicas: a slow host (the cost model then
        # promises a gain from 2 chunks at a 100 ms step, none at 30 ms) and
        # step times per chunk count in use: alone, the chief would keep 2
        # chunks and worker 1 would stay at 1.
        step_ms = {1: 100.0, 2: 50.0} if task == 0 else {1: 30.0, 2: 31.0}
        strategy.uses_gpus = lambda: True
        strategy._host_rates = lambda optimizer=None: cost_model.HostRates(float("inf"), 6.4e4, 2e5, 1e-4)

        class Clock:  # chunking_decision's timer: a step is the time between two readings
            now, readings = 0.0, 0

            def perf_counter(self):
                self.readings += 1
                if self.readings % 2 == 0:
                    self.now += step_ms[strategy.chunking_state.in_use()] / 1e3
                return self.now

        chunking_decision.time = Clock()
        os.environ["TF_GLP_CACHE_DIR"] = os.path.join(args.out, f"cache{task}")
    if args.profile:
        from tf_glp.callbacks import ConcurrencyProfiler
        from tf_glp.profiling import choice

        choice.choose = lambda candidates: (1 if task == 0 else 2, f"forced for worker {task}")
        # A path of its own per worker: none reads the chief's plan (the test
        # wants each to profile), and only the chief's file may appear.
        callbacks.append(ConcurrencyProfiler(trials=1, plan_path=os.path.join(args.out, f"plan{task}.json"), verbose=0))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    history = model.fit(data, epochs=2, verbose=2, callbacks=callbacks).history
    evaluation = model.evaluate(data, verbose=0, return_dict=True)
    predictions = model.predict(x[:64], batch_size=32, verbose=0)
    # Every worker saves (a save may read distributed variables); the chief's file is the model.
    saved = os.path.join(args.out, f"model{task}.keras")
    model.save(saved)
    reloaded = keras.saving.load_model(saved).predict(x[:64], batch_size=32, verbose=0)
    np.savez(os.path.join(args.out, f"w{task}.npz"),
             steps=model.optimizer.iterations.numpy(),
             evaluation=np.array([evaluation["loss"], evaluation["accuracy"]]),
             predictions=predictions,
             chunks=strategy.chunking_state.in_use() if hasattr(strategy, "chunking_state") else 0,
             concurrency=np.array([getattr(layer, "concurrency", 0) or 0 for layer in model.layers
                                   if hasattr(layer, "kernel")]),
             reloaded=reloaded,
             **{f"trainable{i}": v.numpy() for i, v in enumerate(model.trainable_weights)},
             # Batch statistics are per replica (as under MirroredStrategy): these are the first replica's.
             **{f"statistics{i}": v.numpy() for i, v in enumerate(model.non_trainable_weights)},
             **{f"optimizer{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)},
             **({f"history_{name}": np.array(values) for name, values in history.items()}
                if args.micro_batches else {}),
             **({f"variable{i}": v.numpy() for i, v in enumerate(model.variables)} if args.micro_batches else {}),
             **({f"metric_{m.name}": np.array(tf.nest.flatten(m.result())) for m in model.metrics}
                if args.micro_batches else {}))
    if args.chunking:
        print("chunking", task, strategy.chunking_state.explain_lines()[-1].strip(), flush=True)
    if args.profile:
        print("plan reasons", task, [layer.reason for layer in callbacks[-1].plan.layers], flush=True)
    print("done", type(strategy).__name__, type(model.trainable_weights[0].value).__name__, evaluation, flush=True)


def ray_train_loop(config):
    """Ray Train's train_loop_per_worker: the job with config["argv"]."""
    main(config["argv"])


if __name__ == "__main__":
    main()
