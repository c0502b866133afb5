"""What a user sees when fit returns something wrong (cohort._client's
checks of fit's result, without a coordinator), and cohort.torch's flat
vectors."""

import math
import os
import tempfile
import unittest

import numpy as np
import torch

import cohort
import cohort.torch as ct
from cohort import _client

N = 10


def check(out, delta=False, params=None, global_params=None):
    params = np.zeros(N, np.float32) if params is None else params
    global_params = np.ones(N, np.float32) if global_params is None else global_params
    return _client._check_fit_result(out, params, global_params, delta)


class FitResultTest(unittest.TestCase):
    def assertRefused(self, out, message, **kw):
        with self.assertRaises(ValueError) as e:
            check(out, **kw)
        self.assertEqual(str(e.exception), message)

    def test_good_result_is_copied_with_its_metrics(self):
        params = np.zeros(N, np.float32)
        values = np.arange(N, dtype=np.float64)  # float64 is converted.
        samples, loss, acc, steps = check((values, 7, {"loss": 0.5, "accuracy": 0.25, "f1": 3}),
                                          params=params)
        self.assertEqual((samples, loss, acc, steps), (7, 0.5, 0.25, 0))
        np.testing.assert_array_equal(params, np.arange(N, dtype=np.float32))

    def test_steps_are_read_for_fednova(self):
        self.assertEqual(check((np.zeros(N, np.float32), 7, {"steps": 12}))[3], 12)
        self.assertEqual(check((np.zeros(N, np.float32), 7, {"steps": np.int64(3)}))[3], 3)
        for bad, shown in ((-1, "-1"), (2.5, "2.5"), (2**70, str(2**70)), (-2**70, str(-2**70))):
            self.assertRefused((np.zeros(N, np.float32), 7, {"steps": bad}),
                               "fit's metrics['steps'] is %s; expected an int from 0 to 2^63 - 1 "
                               "(the optimizer steps it took)" % shown)

    def test_delta_is_added_to_the_global_model(self):
        params = np.zeros(N, np.float32)
        check((np.full(N, 2.0, np.float32), 1, None), delta=True, params=params,
              global_params=np.full(N, 3.0, np.float32))
        np.testing.assert_array_equal(params, np.full(N, 5.0, np.float32))

    def test_a_tensor_is_read(self):
        params = np.zeros(N, np.float32)
        check((torch.full((2, 5), 4.0), np.int64(3), {}), params=params)
        np.testing.assert_array_equal(params, np.full(N, 4.0, np.float32))

    def test_a_tensor_numpy_cannot_read_says_why(self):
        # The usual fit: torch.cat of the parameters, which still requires grad.
        with self.assertRaises(ValueError) as e:
            check((torch.ones(N, requires_grad=True), 1, {}))
        self.assertTrue(str(e.exception).startswith(
            "fit returned a Tensor for the parameters that NumPy cannot read (RuntimeError: "
            "Can't call numpy() on Tensor that requires grad"), str(e.exception))
        self.assertTrue(str(e.exception).endswith(
            "; expected a NumPy array (or a CPU tensor) of 10 float32 values"), str(e.exception))

    def test_complex_values_are_refused_not_cut_to_their_real_parts(self):
        for values in (np.zeros(N, np.complex64), torch.zeros(N, dtype=torch.complex64)):
            self.assertRefused((values, 1, {}),
                               "fit returned complex values for the parameters; expected a NumPy "
                               "array (or a CPU tensor) of 10 float32 values")

    def test_wrong_length_names_both_sizes(self):
        self.assertRefused((np.zeros(N - 4, np.float32), 1, {}),
                           "fit returned 6 values; the model has 10")

    def test_nan_and_inf_are_refused_with_their_index(self):
        v = np.zeros(N, np.float32)
        v[7] = np.nan
        self.assertRefused((v, 1, {}), "fit returned a non-finite value (nan) at index 7 of 10")
        v[7] = 0
        v[2] = -np.inf
        self.assertRefused((v, 1, {}), "fit returned a non-finite value (inf) at index 2 of 10")
        v[9] = np.nan  # Of two, the first is named.
        self.assertRefused((v, 1, {}), "fit returned a non-finite value (inf) at index 2 of 10")
        v[2] = 0
        self.assertRefused((v, 1, {}), "fit returned a non-finite value (nan) at index 9 of 10")

    def test_a_delta_that_overflows_is_refused(self):
        self.assertRefused((np.full(N, 3e38, np.float32), 1, {}),
                           "fit's delta makes parameter 0 non-finite", delta=True,
                           global_params=np.full(N, 3e38, np.float32))

    def test_wrong_types_are_named(self):
        self.assertRefused("params", "fit returned a str; expected a tuple "
                           "(params, num_samples, metrics)")
        self.assertRefused((np.zeros(N), 1), "fit returned a tuple; expected a tuple "
                           "(params, num_samples, metrics)")
        self.assertRefused(("not an array", 1, {}),
                           "fit returned a str for the parameters; expected a NumPy array "
                           "(or a CPU tensor) of 10 float32 values")
        self.assertRefused((None, 1, {}),
                           "fit returned a NoneType for the parameters; expected a NumPy "
                           "array (or a CPU tensor) of 10 float32 values")

    def test_bad_num_samples_is_named(self):
        self.assertRefused((np.zeros(N), -5, {}),
                           "fit returned num_samples=-5; expected 0 or more, below 2^63")
        self.assertRefused((np.zeros(N), 2**70, {}),
                           "fit returned num_samples=%d; expected 0 or more, below 2^63" % 2**70)
        self.assertRefused((np.zeros(N), np.uint64(2**64 - 1), {}),
                           "fit returned num_samples=%d; expected 0 or more, below 2^63"
                           % (2**64 - 1))
        self.assertRefused((np.zeros(N), 2.5, {}),
                           "fit returned num_samples of type float; expected an int")
        self.assertRefused((np.zeros(N), True, {}),
                           "fit returned num_samples of type bool; expected an int")

    def test_bad_metrics_are_named(self):
        self.assertRefused((np.zeros(N), 1, [0.5]), "fit returned metrics of type list; "
                           "expected a dict of str to float (or None)")
        self.assertRefused((np.zeros(N), 1, {"loss": float("nan")}),
                           "fit's metrics['loss'] is nan; expected a finite number")
        self.assertRefused((np.zeros(N), 1, {"loss": "low"}),
                           "fit's metrics['loss'] is a str; expected a number")
        self.assertRefused((np.zeros(N), 1, {"accuracy": 3.0}),
                           "fit's metrics['accuracy'] is 3; expected 0 to 1")
        self.assertRefused((np.zeros(N), 1, {1: 0.5}),
                           "fit's metrics have a key of type int; expected str")


class ClientArgumentsTest(unittest.TestCase):
    def test_bad_arguments_are_refused_before_connecting(self):
        with self.assertRaisesRegex(ValueError, r"num_samples=0"):
            cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=0, insecure=True)
        with self.assertRaisesRegex(ValueError, r"corrupt_fraction"):
            cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=1, insecure=True,
                          corrupt_fraction=0.7)

    def test_an_unknown_log_level_is_refused_not_taken_for_off(self):
        for level in ("WARNING", "warning", "INFO"):
            with self.assertRaises(ValueError) as e:
                cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=1, insecure=True,
                              log_level=level)
            self.assertEqual(str(e.exception),
                             "Client(log_level='%s'): expected 'trace', 'debug', 'info', 'warn' "
                             "or 'error'" % level)
        cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=1, insecure=True,
                      log_level="warn")

    def test_a_fit_that_is_not_callable_is_refused_before_connecting(self):
        client = cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=1, insecure=True)
        with self.assertRaises(TypeError) as e:
            client.run(fit=None)
        self.assertEqual(str(e.exception), "fit must be callable")

    def test_missing_keys_are_named(self):
        with self.assertRaisesRegex(ValueError, r"Client needs identity= .* and "
                                    r"coordinator_key= .*, or insecure=True"):
            cohort.Client(coordinator="tcp://127.0.0.1:1", num_samples=1)


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3))


class TorchHelpersTest(unittest.TestCase):
    def test_flat_covers_parameters_and_float_buffers_in_state_dict_order(self):
        net = small_net()
        net.train()
        net(torch.randn(4, 1, 4, 4))  # Moves BatchNorm's running statistics.
        flat = ct.get_flat(net)
        sd = net.state_dict()
        expected = np.concatenate([v.numpy().reshape(-1) for k, v in sd.items()
                                   if k != "1.num_batches_tracked"])
        self.assertEqual(flat.dtype, np.float32)
        np.testing.assert_array_equal(flat, expected)
        self.assertEqual(ct.num_params(net), flat.size)

    def test_set_flat_round_trips_into_another_model(self):
        a, b = small_net(), small_net()
        a.train()
        a(torch.randn(4, 1, 4, 4))
        with torch.no_grad():
            for p in a.parameters():
                p.add_(1.0)
        ct.set_flat(b, ct.get_flat(a))
        for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
            if torch.is_floating_point(va):
                self.assertTrue(torch.equal(va, vb), k)
        with self.assertRaisesRegex(ValueError, r"got 3 values; the model has"):
            ct.set_flat(b, np.zeros(3, np.float32))

    def test_get_flat_fills_the_given_buffer(self):
        net = small_net()
        out = np.zeros(ct.num_params(net), np.float32)
        self.assertIs(ct.get_flat(net, out=out), out)
        np.testing.assert_array_equal(out, ct.get_flat(net))

    def test_get_flat_refuses_an_out_it_cannot_fill_in_place(self):
        net = small_net()
        n = ct.num_params(net)
        frozen = np.zeros(n, np.float32)
        frozen.flags.writeable = False  # As the array evaluate receives.
        with self.assertRaisesRegex(ValueError, r"get_flat: out must be a writable, C-contiguous "
                                                r"array \(writeable=False, c_contiguous=True\)"):
            ct.get_flat(net, out=frozen)
        self.assertFalse(frozen.any())
        strided = np.zeros(2 * n, np.float32)[::2]
        with self.assertRaisesRegex(ValueError, r"c_contiguous=False"):
            ct.get_flat(net, out=strided)

    def test_save_initial_writes_the_state_dict_in_order_as_float32(self):
        net = small_net()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "init.npz")
            ct.save_initial(net, path)
            with np.load(path) as z:
                names = list(z.keys())
                arrays = [z[k] for k in names]
        self.assertEqual(names, [k for k, v in net.state_dict().items()
                                 if torch.is_floating_point(v)])
        self.assertTrue(all(a.dtype == np.float32 for a in arrays))
        np.testing.assert_array_equal(np.concatenate([a.reshape(-1) for a in arrays]),
                                      ct.get_flat(net))

    def test_fit_loop_trains(self):
        torch.manual_seed(1)
        x = torch.randn(64, 5)
        y = (x[:, 0] > 0).long()
        net = torch.nn.Linear(5, 2)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                             batch_size=16)
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        n, first = ct.fit_loop(net, loader, opt, 1)
        _, later = ct.fit_loop(net, loader, opt, 5)
        self.assertEqual(n, 64)
        self.assertEqual((first["steps"], later["steps"]), (4, 20))  # 64 / 16 a epoch.
        self.assertLess(later["loss"], first["loss"])
        self.assertGreater(later["accuracy"], 0.9)
        self.assertFalse(math.isnan(later["loss"]))


if __name__ == "__main__":
    unittest.main()
